"""Verify a package's files once, not at every load.

A full check hashes every file the manifest lists (89 MB for distilgpt2 int8: most of a load's time). What it
found is recorded with each file's identity, (size, mtime_ns, ctime_ns, inode, device), in the store's
`.meta/verified/` folder, one small JSON file per package folder (keyed by its real path; a package folder
holds only its listed files, so the record cannot live in it). A later load hashes only the files whose
identity changed since: a file rewritten, replaced, renamed over or touched gets a new mtime or ctime (ctime
cannot be set back by a user), a copy gets a new inode. `verify="full"` (`--verify`) hashes everything again.

The record is a cache, never an authority: one that cannot be read or does not match is ignored, one that
cannot be written (a read-only store) leaves the next load to hash again.
"""

import hashlib
import json
import os
from pathlib import Path

RECORD_LIMIT = 1 << 20  # a record is a few hundred bytes a file
MODES = (True, False, "full")


def identity(stat_result: os.stat_result) -> list[int]:
    """What changes when a file's bytes may have: [size, mtime_ns, ctime_ns, inode, device]."""
    s = stat_result
    return [s.st_size, s.st_mtime_ns, s.st_ctime_ns, s.st_ino, s.st_dev]


def record_path(folder: Path) -> Path:
    """Where the record of the package at `folder` is kept."""
    from ..store.local import META, store_dir  # the store knows where it lives; it imports this package too

    key = hashlib.sha256(os.fsencode(folder.resolve())).hexdigest()[:32]
    return store_dir() / META / "verified" / f"{key}.json"


def read(folder: Path) -> dict:
    """name -> {"identity": [...], "sha256": hex} of the files found intact by the last check; {} when none."""
    try:
        path = record_path(folder)
        with open(path, "rb") as f:
            text = f.read(RECORD_LIMIT + 1)
        data = json.loads(text) if len(text) <= RECORD_LIMIT else {}
        if data.get("folder") != str(folder.resolve()) or not isinstance(data.get("files"), dict):
            return {}
        return {
            name: entry
            for name, entry in data["files"].items()
            if isinstance(entry, dict)
            and isinstance(entry.get("identity"), list)
            and isinstance(entry.get("sha256"), str)
        }
    except (OSError, ValueError, AttributeError, RecursionError):
        return {}


def write(folder: Path, files: dict) -> None:
    """Record `files` (read's shape) for `folder`, replacing the record whole; silent where it cannot be written."""
    path = record_path(folder)
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary.write_text(json.dumps({"folder": str(folder.resolve()), "files": files}), encoding="utf-8")
        os.replace(temporary, path)
    except OSError:
        temporary.unlink(missing_ok=True)
