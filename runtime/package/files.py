"""Open the files of a package folder as untrusted input: every path must stay inside the folder, only
regular files are read (a FIFO or a device could block or never end), and never more bytes than allowed.

The checks come before anything is opened: `inside()` resolves a name (symlinks included) and refuses one that
leads out of the folder or to something that is not a regular file; `open_regular()` and `read_bytes()` are
runtime/untrusted.py's, which every reader of an outside file uses, with a package's error and advice.
"""

import hashlib
import json
import os
import stat
from pathlib import Path

from .. import untrusted
from ..errors import PackageError

CHUNK = 1 << 22
AGAIN = ". Export the package again."


def inside(folder: Path, name: str) -> Path:
    """The real path of `name` in the package folder; PackageError unless it is a regular file in it."""
    root = folder.resolve()
    path = root / name
    if os.path.isabs(name) or ".." in Path(name).parts:
        raise PackageError(
            f"{folder} names {name!r}, a path outside the package folder; a package holds only its own files."
        )
    real = path.resolve()
    if not real.is_relative_to(root):
        raise PackageError(
            f"{path} leads outside the package folder (a link); a package holds only its own files. Export it again."
        )
    try:
        mode = real.stat().st_mode
    except OSError:
        raise PackageError(f"{path} is missing; the package is incomplete. Export it again.") from None
    if not stat.S_ISREG(mode):
        raise PackageError(f"{path} is not a regular file; a package holds only regular files. Export it again.")
    return real


def open_regular(path: Path):
    """A binary file object for a regular file, opened without blocking (a FIFO put in its place cannot hang)."""
    return untrusted.open_regular(path, PackageError, AGAIN)


def read_bytes(path: Path, limit: int) -> bytes:
    """All of a regular file, refused when it holds more than `limit` bytes."""
    return untrusted.read_bytes(path, limit, PackageError, AGAIN, what="a package file of its kind")


def read_json(path: Path, limit: int) -> dict:
    """A JSON object from a regular file of at most `limit` bytes; one clear PackageError for anything else."""
    try:
        data = json.loads(read_bytes(path, limit).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as error:  # JSONDecodeError, and numbers too long to convert
        raise PackageError(f"cannot read {path}: {error}. The package is damaged; export it again.") from None
    except RecursionError:
        raise PackageError(f"{path} is nested too deeply to be a package file; the package is damaged.") from None
    if not isinstance(data, dict):
        raise PackageError(f"{path} does not hold a JSON object; the package is damaged.")
    return data


def sha256_of(path: Path, limit: int | None = None) -> str:
    """The sha256 of a regular file's first `limit` bytes (all of it when None)."""
    digest = hashlib.sha256()
    left = limit if limit is not None else float("inf")
    with open_regular(path) as f:
        while left > 0:
            chunk = f.read(int(min(CHUNK, left)))
            if not chunk:
                break
            digest.update(chunk)
            left -= len(chunk)
    return digest.hexdigest()


def file_record(path: Path) -> dict:
    """A file's entry in the manifest: its size and sha256."""
    return {"size": path.stat().st_size, "sha256": sha256_of(path)}
