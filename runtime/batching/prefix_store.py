"""The prefix cache's blocks on disk, so that a prompt seen before a restart still skips its prefill.

`edgelm serve --prefix-cache-dir DIR` (and load(..., prefix_cache_dir=DIR)) writes each block the in-memory cache
stores (runtime/batching/prefix_cache.py: the key/value rows of one whole prefill pass of `chunk` tokens) to a file
of its own, and a prompt whose start is not in memory looks for its blocks there. A block file is

    EDGELMKV1\\n  {"package", "chunk", "tokens", "arrays": [[dtype, shape], ...], "sha256"}\\n  the rows' bytes

named by the sha256 of the package's identity and the token ids up to the block's end: a file is found only by
the exact tokens it holds, for the exact package (its manifest's sha256, which lists every file's own). Reading
checks all of it, the rows' sha256 included, within the size the header implies, from a regular file only; a file
that fails any check is a miss (and removed). Writes go to a temporary file renamed into place, so a reader sees a
whole file or none, and two servers may share one folder. The folder is bounded: past `max_bytes`, the files used
least recently (by modification time, refreshed on each use) are removed.
"""

import hashlib
import json
import math
import numbers
import os
from pathlib import Path

import numpy as np

from .. import untrusted
from ..errors import EdgelmError, GenerationOptionError, PackageError

MAGIC = b"EDGELMKV1\n"
DISK_DEFAULT_MB = 1024  # a folder's bound unless given: a thousand distilgpt2-sized 128-token blocks and more
MAX_HEADER = 1 << 20  # bytes of a header line: the token ids of a long prompt, well under this
SUFFIX = ".kv"


class PrefixStore:
    """Blocks of key/value rows in `folder`, for the package `package_id`, at most `max_bytes` of files."""

    def __init__(self, folder, package_id: str, chunk: int, max_bytes: int):
        self.folder, self.package_id, self.chunk, self.max_bytes = Path(folder), package_id, int(chunk), int(max_bytes)
        self.folder.mkdir(parents=True, exist_ok=True)

    def name(self, tokens) -> Path:
        digest = hashlib.sha256(f"{self.package_id}:{self.chunk}:".encode())
        digest.update(np.asarray(tokens, dtype="<i8").tobytes())
        return self.folder / (digest.hexdigest() + SUFFIX)

    def load(self, tokens, like: list) -> tuple | None:
        """The rows stored for the block ending the token ids `tokens`, shaped and typed as `like` (one array per
        cache tensor, [H, chunk, D]); None when there is none, or the file is not exactly that."""
        path = self.name(tokens)
        rows = read_block(path, self.package_id, self.chunk, tokens, like)
        if rows is None:
            if path.exists():
                path.unlink(missing_ok=True)
            return None
        try:
            os.utime(path)  # used now: the last to be removed
        except OSError:
            pass
        return rows

    def save(self, tokens, rows: tuple) -> None:
        """Write a block (the rows of the chunk ending `tokens`), then remove the oldest files past max_bytes."""
        path = self.name(tokens)
        if path.exists():
            return
        data = block_bytes(self.package_id, self.chunk, tokens, rows)
        if len(data) > self.max_bytes:
            return
        write_atomically(path, data)
        self._trim()

    def _trim(self) -> None:
        files = []
        for entry in os.scandir(self.folder):
            if entry.name.endswith(SUFFIX) and entry.is_file(follow_symlinks=False):
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:  # another server removed it
                    continue
                files.append((info.st_mtime_ns, info.st_size, entry.path))
        total = sum(size for _, size, _ in files)
        for _, size, path in sorted(files):
            if total <= self.max_bytes:
                break
            Path(path).unlink(missing_ok=True)
            total -= size


def block_bytes(package_id: str, chunk: int, tokens, rows: tuple) -> bytes:
    payload = b"".join(np.ascontiguousarray(r).tobytes() for r in rows)
    header = {
        "package": package_id,
        "chunk": chunk,
        "tokens": [int(t) for t in tokens],
        "arrays": [[r.dtype.str, list(r.shape)] for r in rows],
        "sha256": hashlib.sha256(payload).hexdigest(),
    }
    return MAGIC + json.dumps(header, separators=(",", ":")).encode() + b"\n" + payload


def read_block(path: Path, package_id: str, chunk: int, tokens, like: list) -> tuple | None:
    """A block file's rows if it is exactly the block of `tokens` for this package, shaped as `like`; else None."""
    expected = [[np.asarray(a).dtype.str, list(np.asarray(a).shape)] for a in like]
    payload_size = sum(np.asarray(a).nbytes for a in like)
    try:  # a regular file only, opened without blocking (a FIFO never hangs), within the size the header implies
        data = untrusted.read_bytes(path, len(MAGIC) + MAX_HEADER + payload_size)
    except EdgelmError:
        return None
    if not data.startswith(MAGIC):
        return None
    end = data.find(b"\n", len(MAGIC))
    if end < 0:
        return None
    try:
        header = json.loads(data[len(MAGIC) : end])
    except (ValueError, RecursionError):
        return None
    payload = data[end + 1 :]
    if (
        not isinstance(header, dict)
        or header.get("package") != package_id
        or header.get("chunk") != chunk
        or header.get("tokens") != [int(t) for t in tokens]
        or header.get("arrays") != expected
        or len(payload) != payload_size
        or header.get("sha256") != hashlib.sha256(payload).hexdigest()
    ):
        return None
    out, at = [], 0
    for dtype, shape in expected:
        array = np.frombuffer(payload, dtype=np.dtype(dtype), count=int(np.prod(shape)), offset=at).reshape(shape)
        out.append(array.copy())
        at += array.nbytes
    return tuple(out)


def write_atomically(path: Path, data: bytes) -> None:
    """`data` into `path` through a temporary file in the same folder, renamed into place; nothing on failure."""
    import tempfile  # only here: shutil, bz2 and lzma come with it, and most loads write no block

    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".", suffix=".partial")
    try:
        with os.fdopen(handle, "wb") as file:
            file.write(data)
        os.replace(temporary, path)
    except OSError:
        Path(temporary).unlink(missing_ok=True)


def disk_store(package, folder, megabytes, memory_bytes: int, chunk: int):
    """The PrefixStore a load() with prefix_cache_dir asks for (None without one), its options checked here."""
    if folder is None:
        return None
    if not isinstance(folder, (str, os.PathLike)) or not str(folder):
        raise GenerationOptionError("prefix_cache_dir must be a folder's path", param="prefix_cache_dir")
    if not memory_bytes:
        raise GenerationOptionError(
            "prefix_cache_dir keeps the prefix cache's blocks on disk: give prefix_cache_mb > 0 too",
            param="prefix_cache_dir",
        )
    if not isinstance(megabytes, numbers.Real) or isinstance(megabytes, bool) or not 0 < megabytes < math.inf:
        raise GenerationOptionError(
            f"prefix_cache_disk_mb must be a number of MiB > 0, got {str(megabytes)[:40]}", param="prefix_cache_disk_mb"
        )
    listed = package.folder / "manifest.json"
    if package.manifest is None or not listed.is_file():
        raise PackageError(f"prefix_cache_dir needs an edgelm package (one with a manifest); {package.folder} has none")
    identity = hashlib.sha256(listed.read_bytes()).hexdigest()  # lists every file's sha256: the package itself
    try:
        return PrefixStore(folder, identity, chunk, int(megabytes * (1 << 20)))
    except OSError as error:
        raise GenerationOptionError(
            f"prefix_cache_dir {folder}: cannot use it as a folder ({error.strerror or error})", param="prefix_cache_dir"
        ) from None
