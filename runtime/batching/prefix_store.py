"""The prefix cache's blocks on disk, so that a prompt seen before a restart still skips its prefill.

`edgelm serve --prefix-cache-dir DIR` (and load(..., prefix_cache_dir=DIR)) writes each block the in-memory cache
stores (runtime/batching/prefix_cache.py: the key/value rows of one prefill pass, whole or ending at a conversation
start) to a file of its own, reads the most recently used ones back at load (PrefixCache.preload), and a prompt whose
start is not in memory looks for its blocks there. A block file is

    EDGELMKV1\\n  {"package", "chunk", ["start",] "tokens", "arrays": [[dtype, shape], ...], "sha256"}\\n
    the rows' bytes

named by the sha256 of the package's identity, the token ids up to the block's end and the conversation start its
passes broke at ("start", runtime/engine/passes.py; absent where they broke nowhere before the block's end): a file
is found only by the exact tokens it holds, made in the exact passes, for the exact package (its manifest's sha256,
which lists every file's own). Reading checks all of it, the rows' sha256 included, within the size the header
implies, from a regular file only; a file that fails any check is a miss (and removed). Writes go to a temporary
file renamed into place, so a reader sees a whole file or none, and two servers may share one folder. The folder is
bounded: past `max_bytes`, the files used least recently (by modification time, refreshed on each use) are removed.

A saved conversation (Model.save_session, runtime/model/saved_session.py) is one file of the same format, read by
the same checks (read_record).
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
from ..inputs import is_token_id
from ..package.format import MAX_JSON_BYTES

MAGIC = b"EDGELMKV1\n"
DISK_DEFAULT_MB = 1024  # a folder's bound unless given: a thousand distilgpt2-sized 128-token blocks and more
MAX_HEADER = 1 << 20  # bytes of a header line: the token ids of a long prompt, well under this
SUFFIX = ".kv"
HEADER_READ = 64 << 10  # bytes read at a time while looking for a header's end
PRELOAD_FILES = 1024  # block files whose headers a load reads at most, the most recently used first
MAX_ID = 2**31  # above any vocabulary's ids: a header's token id past it is no token (and no int64 overflow)


class PrefixStore:
    """Blocks of key/value rows in `folder`, for the package `package_id`, at most `max_bytes` of files."""

    def __init__(self, folder, package_id: str, chunk: int, max_bytes: int):
        self.folder, self.package_id, self.chunk, self.max_bytes = Path(folder), package_id, int(chunk), int(max_bytes)
        self.folder.mkdir(parents=True, exist_ok=True)

    def name(self, tokens, start: int = 0) -> Path:
        digest = hashlib.sha256(f"{self.package_id}:{self.chunk}:".encode())
        digest.update(np.asarray(tokens, dtype="<i8").tobytes())
        if start:
            digest.update(f":start {start}".encode())
        return self.folder / (digest.hexdigest() + SUFFIX)

    def load(self, tokens, start: int, like: list) -> tuple | None:
        """The rows stored for the block ending the token ids `tokens`, made in passes broken at `start` (0: none
        before its end), shaped and typed as `like` (one array per cache tensor, [H, n, D]); None when there is
        none, or the file is not exactly that."""
        path = self.name(tokens, start)
        rows = read_block(path, self.package_id, self.chunk, tokens, like, start)
        if rows is None:
            if path.exists():
                path.unlink(missing_ok=True)
            return None
        try:
            os.utime(path)  # used now: the last to be removed
        except OSError:
            pass
        return rows

    def save(self, tokens, start: int, rows: tuple) -> None:
        """Write a block (the rows of the pass ending `tokens`, broken at `start`), then remove the oldest files
        past max_bytes."""
        path = self.name(tokens, start)
        if path.exists():
            return
        data = block_bytes(self.package_id, self.chunk, tokens, rows, start)
        if len(data) > self.max_bytes:
            return
        write_atomically(path, data)
        self._trim()

    def recent(self):
        """(token ids, start) of the folder's block files, the most recently used first (PRELOAD_FILES of them at
        most), as their headers say (unchecked: load() checks each); files of another package or chunk left out."""
        for _, _, path in sorted(self._files(), reverse=True)[:PRELOAD_FILES]:
            header = read_header(Path(path))
            tokens, start = (header or {}).get("tokens"), (header or {}).get("start", 0)
            if (
                header is not None
                and header.get("package") == self.package_id
                and header.get("chunk") == self.chunk
                and isinstance(tokens, list)
                and all(is_token_id(t, MAX_ID) for t in tokens)
                and isinstance(start, int)
                and not isinstance(start, bool)
                and 0 <= start <= len(tokens)
            ):
                yield tokens, start

    def _files(self) -> list:
        """(modification time ns, size, path) of the folder's block files (regular files only)."""
        files = []
        for entry in os.scandir(self.folder):
            if entry.name.endswith(SUFFIX) and entry.is_file(follow_symlinks=False):
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:  # another server removed it
                    continue
                files.append((info.st_mtime_ns, info.st_size, entry.path))
        return files

    def _trim(self) -> None:
        files = self._files()
        total = sum(size for _, size, _ in files)
        for _, size, path in sorted(files):
            if total <= self.max_bytes:
                break
            Path(path).unlink(missing_ok=True)
            total -= size


def block_bytes(package_id: str, chunk: int, tokens, rows: tuple, start: int = 0) -> bytes:
    header = {"package": package_id, "chunk": chunk, **({"start": start} if start else {})}
    return record_bytes({**header, "tokens": [int(t) for t in tokens]}, rows)


def record_bytes(header: dict, rows) -> bytes:
    """A file of this format: MAGIC, `header` with the rows' [dtype, shape] and their sha256 added, the rows' bytes.
    A block's header holds its package, chunk and tokens; other records (a saved session: model/saved_session.py)
    add their own keys."""
    payload = b"".join(np.ascontiguousarray(r).tobytes() for r in rows)
    header = {**header, "arrays": [[r.dtype.str, list(r.shape)] for r in rows]}
    header["sha256"] = hashlib.sha256(payload).hexdigest()
    return MAGIC + json.dumps(header, separators=(",", ":")).encode() + b"\n" + payload


def read_block(path: Path, package_id: str, chunk: int, tokens, like: list, start: int = 0) -> tuple | None:
    """A block file's rows if it is exactly the block of `tokens` (in passes broken at `start`) for this package,
    shaped as `like`; else None."""
    expected = [[np.asarray(a).dtype.str, list(np.asarray(a).shape)] for a in like]
    payload_size = sum(np.asarray(a).nbytes for a in like)
    try:  # a regular file only, opened without blocking (a FIFO never hangs), within the size the header implies
        header, rows = read_record(path, MAX_HEADER + payload_size)
    except EdgelmError:
        return None
    if (
        header.get("package") != package_id
        or header.get("chunk") != chunk
        or header.get("start", 0) != start
        or header.get("tokens") != [int(t) for t in tokens]
        or header.get("arrays") != expected
    ):
        return None
    return rows


def read_record(
    path, limit: int, error=EdgelmError, advice: str = "", what: str = "a key/value file", max_header=MAX_HEADER
) -> tuple:
    """(header, rows) of a file of this format, every check of the format made: a regular file of at most
    len(MAGIC) + `limit` bytes (untrusted.read_bytes), its magic, a JSON header line (of at most `max_header`
    bytes) of numeric arrays whose bytes are exactly the rest of the file, and their sha256. `error` says which check failed, ending with `advice`; the
    header's other keys are the caller's to check."""
    data = untrusted.read_bytes(path, len(MAGIC) + limit, error, advice, what)
    end = data.find(b"\n", len(MAGIC), len(MAGIC) + max_header + 1) if data.startswith(MAGIC) else -1
    header = None
    if end >= 0:
        try:
            header = json.loads(data[len(MAGIC) : end])
        except (ValueError, RecursionError):
            pass
    arrays = header.get("arrays") if isinstance(header, dict) else None
    if not isinstance(arrays, list) or not all(_array_spec(a) for a in arrays):
        raise error(f"{path} is not {what} of this edgelm (its header cannot be read){advice}")
    payload = memoryview(data)[end + 1 :]
    shapes = [(np.dtype(dtype), shape) for dtype, shape in arrays]
    if len(payload) != sum(dtype.itemsize * math.prod(shape) for dtype, shape in shapes):
        raise error(f"{path} is truncated or has bytes added: its size is not what its header says{advice}")
    if header.get("sha256") != hashlib.sha256(payload).hexdigest():
        raise error(f"{path} was altered: its content does not match its sha256{advice}")
    rows, at = [], 0
    for dtype, shape in shapes:
        count = math.prod(shape)
        rows.append(np.frombuffer(payload, dtype=dtype, count=count, offset=at).reshape(shape).copy())
        at += count * dtype.itemsize
    return header, tuple(rows)


def _array_spec(spec) -> bool:
    """Whether a header's [dtype, shape] names a numeric array (never an object one) of non-negative sizes."""
    if not (isinstance(spec, list) and len(spec) == 2 and isinstance(spec[0], str) and isinstance(spec[1], list)):
        return False
    try:
        dtype = np.dtype(spec[0])
    except (TypeError, ValueError):
        return False
    sizes = spec[1]
    return dtype.kind in "fiub" and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in sizes)


def read_header(path: Path) -> dict | None:
    """The header of a block file (its first line after the magic) as a dict, without reading its rows; None
    when the file is not a regular file of this format."""
    data, end = b"", -1
    try:
        with untrusted.open_regular(path) as file:
            while end < 0 and len(data) < len(MAGIC) + MAX_HEADER:  # a line at a time: the rows stay unread
                piece = file.read(min(HEADER_READ, len(MAGIC) + MAX_HEADER - len(data)))
                if not piece:
                    break
                end = piece.find(b"\n", max(len(MAGIC) - len(data), 0))
                end = end + len(data) if end >= 0 else -1
                data += piece
    except (EdgelmError, OSError):
        return None
    if not data.startswith(MAGIC) or end < 0:
        return None
    try:
        header = json.loads(data[len(MAGIC) : end])
    except (ValueError, RecursionError):
        return None
    return header if isinstance(header, dict) else None


def write_atomically(path: Path, data: bytes) -> None:
    """`data` into `path` through a temporary file in the same folder, renamed into place; nothing on failure."""
    try:
        replace_atomically(path, data)
    except OSError:
        pass


def replace_atomically(path: Path, data: bytes) -> None:
    """write_atomically that raises the OSError of a failed write (the temporary file removed): a reader of `path`
    sees the old file whole or the new one whole. The file gets the permissions of any file made under the umask
    (a package's manifest stays readable by those who read its other files)."""
    path = Path(path)
    temporary = path.with_name(f".{os.urandom(8).hex()}.partial")
    # a new file of a name no one could have prepared (O_EXCL): never a FIFO or a link put there in advance
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
    handle = os.open(temporary, flags, 0o666)
    try:
        with os.fdopen(handle, "wb") as file:
            file.write(data)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


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
    identity = package_identity(package, "prefix_cache_dir")
    try:
        return PrefixStore(folder, identity, chunk, int(megabytes * (1 << 20)))
    except OSError as error:
        raise GenerationOptionError(
            f"prefix_cache_dir {folder}: cannot use it as a folder ({error.strerror or error})", param="prefix_cache_dir"
        ) from None


def package_identity(package, needed_by: str) -> str:
    """What a key/value file is bound to: the sha256 of the package's manifest, which lists every file's own (the
    package itself). PackageError, naming what `needed_by` it, for a folder without a manifest."""
    listed = package.folder / "manifest.json"
    if package.manifest is None or not listed.is_file():
        raise PackageError(f"{needed_by} needs an edgelm package (one with a manifest); {package.folder} has none")
    return hashlib.sha256(untrusted.read_bytes(listed, MAX_JSON_BYTES, PackageError, what="a manifest")).hexdigest()
