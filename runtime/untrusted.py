"""Read a file that came from outside as hostile input: a package's files, a signing key, a signature, a cache
record, a file of prompts, an output being resumed. Every reader of such a file goes through here.

- Only a regular file is read: a FIFO blocks the open (for a writer) or the read forever, and a device such as
  /dev/zero never ends. A link is followed, so a link to a regular file is that file and a link to a FIFO is a
  FIFO.
- The check is made before the open (stat) and again on the open descriptor (fstat), and the open itself never
  waits (O_NONBLOCK; blocking is turned back on once the descriptor is known to be a regular file's), so what
  was checked is what is read, even if the name is swapped in between.
- Never more than a bound: `read_bytes` reads at most `limit` bytes and refuses a file that holds more, and
  `read_line` reads one line of at most `limit` bytes, skipping the rest of a longer one without holding it.

`open_append` opens a file to append to (a resumed output) the same way: never waiting, regular files only.
Each caller passes its own error type and the advice its message ends with (what the user should do)."""

import os
import stat
from pathlib import Path

from .errors import EdgelmError

FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)
SKIP = 1 << 20  # the piece of an over-long line read at a time while skipping it


def kind(mode: int) -> str:
    """What a file of this st_mode is, in words: "a regular file", "a FIFO", "a character device", ..."""
    if stat.S_ISREG(mode):
        return "a regular file"
    return next((name for test, name in KINDS if test(mode)), "not a regular file")


def regular(path, error=EdgelmError, advice: str = "") -> os.stat_result:
    """The stat of `path` (links followed) if it is a regular file; `error` naming what it is otherwise."""
    try:
        st = os.stat(path)
    except (OSError, ValueError) as failure:  # ValueError: a NUL in the name
        raise error(f"cannot read {path}: {getattr(failure, 'strerror', None) or failure}{advice}") from None
    if not stat.S_ISREG(st.st_mode):
        raise error(f"{path} is not a regular file (it is {kind(st.st_mode)}){advice}")
    return st


def open_regular(path, error=EdgelmError, advice: str = ""):
    """A binary file object reading `path`, which must be a regular file (checked before and after the open,
    which never blocks); `error(message)` is raised otherwise, the message ending with `advice`."""
    regular(path, error, advice)
    try:
        fd = os.open(path, FLAGS)
    except OSError as failure:
        raise error(f"cannot read {path}: {failure.strerror or failure}{advice}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):  # swapped after the stat above
            raise error(f"{path} is not a regular file (it is {kind(mode)}){advice}")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def open_append(path, error=EdgelmError, advice: str = ""):
    """An unbuffered binary file object appending to `path` (made if missing), which must be a regular file: the
    open never waits (a FIFO with no reader fails at once) and the descriptor is checked before it is used."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags | getattr(os, "O_BINARY", 0), 0o644)
    except OSError as failure:
        raise error(f"cannot write {path}: {failure.strerror or failure}{advice}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise error(f"{path} is not a regular file (it is {kind(mode)}){advice}")
    if hasattr(os, "set_blocking"):
        os.set_blocking(fd, True)
    return os.fdopen(fd, "ab", buffering=0)


def read_bytes(path, limit: int, error=EdgelmError, advice: str = "", what: str = "a file of its kind") -> bytes:
    """All of the regular file `path`, refused (`error`) when it holds more than `limit` bytes."""
    try:
        with open_regular(path, error, advice) as f:
            data = f.read(limit + 1)
    except OSError as failure:  # a read error (EIO), after a successful open
        raise error(f"cannot read {path}: {failure.strerror or failure}{advice}") from None
    if len(data) > limit:
        raise error(f"{path} is larger than {what} may be ({limit:,} bytes){advice}")
    return data


def read_text(path, limit: int, error=EdgelmError, advice: str = "", what: str = "a file of its kind") -> str:
    """read_bytes decoded as UTF-8 (undecodable bytes replaced: the caller's parser says what is wrong)."""
    return read_bytes(path, limit, error, advice, what).decode("utf-8", "replace")


def read_line(file, limit: int) -> tuple[bytes | None, int]:
    """(the next line of the open binary `file` with its newline, or None for one over `limit` bytes; the bytes
    it took in the file). An over-long line is skipped SKIP bytes at a time, never held whole; at the end of the
    file the line is b"" and 0 bytes."""
    line = file.readline(limit + 1)
    if len(line) <= limit or line.endswith(b"\n"):
        return line, len(line)
    taken = len(line)
    while line and not line.endswith(b"\n"):
        line = file.readline(SKIP)
        taken += len(line)
    return None, taken


def is_regular(path: Path) -> bool:
    """Whether `path` names a regular file (links followed); False for a name the system cannot look up."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False
