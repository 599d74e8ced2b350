"""Verify a package's files once, not at every load.

A full check hashes every file the manifest lists (89 MB for distilgpt2 int8: most of a load's time). What it
found is recorded with each file's identity, (size, mtime_ns, ctime_ns, inode, device), in the user's cache
folder (cache_dir: ~/.cache/edgelm/verified, or $EDGELM_CACHE), one small JSON file per package folder, keyed by
its real path. Not beside the package, whose folder holds only its listed files, nor in the store, whose
contents are what installs put there (a package outside the store is checked too). A later load hashes only the files whose
identity changed since: a file rewritten, replaced, renamed over or touched gets a new mtime or ctime (ctime
cannot be set back by a user), a copy gets a new inode. `verify="full"` (`--verify`) hashes everything again.

The record is a cache, never an authority: one that cannot be read (not a regular file: a FIFO there never
blocks a load; over RECORD_LIMIT; not JSON) or does not match is ignored, one that cannot be written (a
read-only home) leaves the next load to hash again. A record is written under a new name made with O_EXCL,
then renamed over the old one, so nothing put at a predictable name in advance is written through.
"""

import hashlib
import json
import os
import sys
from pathlib import Path

from .. import untrusted
from ..errors import EdgelmError

RECORD_LIMIT = 1 << 20  # a record is a few hundred bytes a file
MODES = (True, False, "full")


def identity(stat_result: os.stat_result) -> list[int]:
    """What changes when a file's bytes may have: [size, mtime_ns, ctime_ns, inode, device]."""
    s = stat_result
    return [s.st_size, s.st_mtime_ns, s.st_ctime_ns, s.st_ino, s.st_dev]


def cache_dir() -> Path:
    """Where the records are kept: $EDGELM_CACHE, else the user's cache folder's edgelm/verified."""
    if os.environ.get("EDGELM_CACHE"):
        return Path(os.environ["EDGELM_CACHE"]).expanduser()
    if sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local") / "edgelm" / "cache"
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "edgelm"
    return base / "verified"


def record_path(folder: Path) -> Path:
    """Where the record of the package at `folder` is kept."""
    key = hashlib.sha256(os.fsencode(folder.resolve())).hexdigest()[:32]
    return cache_dir() / f"{key}.json"


def read(folder: Path) -> dict:
    """name -> {"identity": [...], "sha256": hex} of the files found intact by the last check; {} when none."""
    try:
        data = json.loads(untrusted.read_bytes(record_path(folder), RECORD_LIMIT))  # a FIFO there is refused
        if data.get("folder") != str(folder.resolve()) or not isinstance(data.get("files"), dict):
            return {}
        return {
            name: entry
            for name, entry in data["files"].items()
            if isinstance(entry, dict)
            and isinstance(entry.get("identity"), list)
            and isinstance(entry.get("sha256"), str)
        }
    except (EdgelmError, OSError, ValueError, AttributeError, RecursionError):
        return {}


def write(folder: Path, files: dict) -> None:
    """Record `files` (read's shape) for `folder`, replacing the record whole; silent where it cannot be written."""
    import tempfile  # only here: a load whose record matches writes nothing

    path = record_path(folder)
    temporary = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # a new file of a name no one could have prepared (O_EXCL): never a FIFO or a link put there in advance
        fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(json.dumps({"folder": str(folder.resolve()), "files": files}))
        os.replace(temporary, path)
    except OSError:
        if temporary is not None:
            Path(temporary).unlink(missing_ok=True)
