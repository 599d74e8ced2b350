"""An exclusive hold on an output file while a job appends to it, on every system: flock where the system has
fcntl, msvcrt's byte lock on Windows, else a lock file beside the output (OUTPUT.lock, holding the pid; one a
killed run left is taken over). LOCKS forces a kind (tests use ["file"] to run the portable path on Linux)."""

import os
from contextlib import contextmanager
from pathlib import Path

from .. import untrusted
from ..errors import EdgelmError


@contextmanager
def hold(out, path: Path, refused: Exception):
    """Hold `out` (the open file at `path`) for this process alone while the block runs; raise `refused` if
    another holds it."""
    kind = LOCKS[0] if LOCKS else _lock_kind()
    if kind == "flock":
        import fcntl

        try:
            fcntl.flock(out.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise refused from None
        try:
            yield
        finally:
            fcntl.flock(out.fileno(), fcntl.LOCK_UN)
    elif kind == "msvcrt":
        import msvcrt

        fd = os.dup(out.fileno())  # its own position: the byte locked lies far past any output
        try:
            os.lseek(fd, LOCK_OFFSET, os.SEEK_SET)
            try:
                msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
            except OSError:
                raise refused from None
            try:
                yield
            finally:
                os.lseek(fd, LOCK_OFFSET, os.SEEK_SET)
                msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)
        finally:
            os.close(fd)
    else:
        with _lock_file(path.with_name(path.name + ".lock"), refused):
            yield


LOCKS: list = []  # empty: the first kind this system has; tests set ["file"] to use the portable lock file
LOCK_OFFSET = 1 << 40  # msvcrt locks a byte range: one byte no output reaches


def _lock_kind() -> str:
    for kind, module in (("flock", "fcntl"), ("msvcrt", "msvcrt")):
        try:
            __import__(module)
            return kind
        except ImportError:
            pass
    return "file"


@contextmanager
def _lock_file(lock: Path, refused: Exception):
    """OUTPUT.lock made with O_EXCL and holding its run's pid; one left by a run that is gone is taken over."""
    for _ in range(2):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            break
        except FileExistsError:
            if _alive(lock):
                raise refused from None
            lock.unlink(missing_ok=True)  # its run was killed
    else:
        raise refused
    try:
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        yield
    finally:
        lock.unlink(missing_ok=True)


def _alive(lock: Path) -> bool:
    try:
        pid = int(untrusted.read_text(lock, 32).strip() or 0)  # a pid; a FIFO or a huge file there is refused
    except (EdgelmError, ValueError):
        return True  # being written this instant, or unreadable: not ours to take
    if pid <= 0:
        return True
    try:
        os.kill(pid, 0)  # signal 0: whether it exists (POSIX: Windows has msvcrt and never reaches this)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True
