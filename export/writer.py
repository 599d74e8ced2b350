"""Stage 6, save: write the package folder atomically and describe it in manifest.json.

Everything is written into a hidden sibling folder first (`.NAME.partial-PID`); only a complete folder,
manifest last, is moved into place. An export stopped at any point leaves no folder that looks like a
package, and the next export to the same place sweeps up partial folders whose process is gone.

Replacing a package (--force) swaps the two folders in one step where the system can (Linux's
renameat2 RENAME_EXCHANGE, macOS's renamex_np RENAME_SWAP): the path always holds one complete package. Elsewhere the old package is first
renamed aside (`.NAME.replaced-PID`); if the export dies before the new one is in place, the next export
moves the old one back. SIGINT and SIGTERM wait while the folders move, so an export either reports the
new package or leaves the old one.
"""

import ctypes
import errno
import json
import os
import shutil
import signal
import threading
import time
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from edgelm.runtime.engine import native
from edgelm.runtime.package.format import MANIFEST, FileRecord, FormatError, Manifest
from edgelm.runtime.package.open import file_record

from .errors import ExportError

PARTIAL = ".partial-"
REPLACED = ".replaced-"


def refuse_existing(output: Path, force: bool) -> None:
    """A file in the way, or a non-empty folder without --force: cheap, so checked before the slow stages too."""
    if output.exists() and not output.is_dir():
        raise ExportError(f"{output} exists and is a file; choose another output folder.")
    above = output.parent
    while not above.exists() and above != above.parent:
        above = above.parent
    if not above.is_dir():
        raise ExportError(f"cannot create {output.parent}: {above} is a file. Choose another output folder with -o.")
    if output.is_dir() and any(output.iterdir()) and not force:
        raise ExportError(f"{output} already exists and is not empty; pass --force to replace it.")


def check_destination(output: Path, force: bool, needed_bytes: int) -> None:
    """Refuse early: existing package without --force, an unwritable place, or too little disk space."""
    refuse_existing(output, force)
    parent = output.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ExportError(
            f"cannot create {parent}: {error.strerror}. Choose a writable output folder with -o."
        ) from None
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ExportError(f"cannot write to {parent}: permission denied. Choose a writable output folder with -o.")
    free = shutil.disk_usage(parent).free
    if free < needed_bytes:
        raise ExportError(
            f"not enough disk space in {parent}: the package needs about {needed_bytes / 1e6:.0f} MB, {free / 1e6:.0f} MB are free."
        )


def sweep_partials(output: Path) -> None:
    """Tidy up after exports to this output that no longer run: a package one of them had moved aside goes
    back to the path when nothing is there (it is the only complete one), else it is removed, and so are
    their partial folders."""
    if not output.parent.is_dir():
        return
    for folder in _leftovers(output, REPLACED):
        if output.is_dir() and not output.is_symlink() and not any(output.iterdir()):
            output.rmdir()  # an empty folder made since is no package; the one moved aside is
        if not output.exists() and not output.is_symlink():
            try:
                os.rename(folder, output)
            except OSError as error:
                raise ExportError(
                    f"{folder} holds the package an earlier export moved aside, and it cannot go back to {output} "
                    f"({error.strerror}); move it there yourself."
                ) from None
        else:
            shutil.rmtree(folder, ignore_errors=True)
    for folder in _leftovers(output, PARTIAL):
        shutil.rmtree(folder, ignore_errors=True)


def _leftovers(output: Path, kind: str) -> list[Path]:
    """Hidden folders of one kind for this output whose process is gone."""
    found = []
    for folder in output.parent.glob(f".{output.name}{kind}*"):
        pid = folder.name.rsplit(kind, 1)[-1]
        if not pid.isdigit() or not _alive(int(pid)):
            found.append(folder)
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class PackageWriter:
    """Collects files in a partial folder, then moves the complete folder into place (see the module docstring)."""

    def __init__(self, output: Path):
        self.output = output
        self.partial = output.parent / f".{output.name}{PARTIAL}{os.getpid()}"
        shutil.rmtree(self.partial, ignore_errors=True)
        self.partial.mkdir(parents=True)

    def write_bytes(self, name: str, data: bytes) -> None:
        self._guard(name, lambda path: path.write_bytes(data))

    def write_chunks(self, name: str, chunks) -> None:
        """A file written piece by piece (model.onnx.data: never one bytes object in memory)."""

        def write(path):
            with open(path, "wb") as handle:
                for chunk in chunks:
                    handle.write(chunk)

        self._guard(name, write)

    def write_json(self, name: str, data: dict) -> None:
        try:
            text = json.dumps(data, indent=2, sort_keys=False, allow_nan=False)
        except ValueError:  # NaN or Infinity: JSON has no such numbers, and a reader could not trust them
            raise ExportError(
                f"{name} would hold a NaN or infinite number, which is not valid JSON; nothing was written. "
                "Please report this with the checkpoint's config.json."
            ) from None
        self.write_bytes(name, (text + "\n").encode())

    def copy(self, name: str, source: Path) -> None:
        self._guard(name, lambda path: shutil.copyfile(source, path))

    def _guard(self, name, write):
        try:
            write(self.partial / name)
        except OSError as error:
            if error.errno == errno.ENOSPC:
                raise ExportError(
                    f"the disk filled up while writing {name} to {self.output.parent}; free some space and export again."
                ) from None
            raise ExportError(f"cannot write {name} to {self.output.parent}: {error.strerror}.") from None

    def publish(self, manifest: Manifest) -> dict:
        """Checksum every file, write the manifest last, then move the folder into place. Returns the manifest
        as written; it is read back first, as the runtime will read it, so no export writes one it refuses."""
        files = {p.name: FileRecord(**file_record(p)) for p in sorted(self.partial.iterdir())}
        created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        manifest = replace(manifest, files=files, created=created).to_dict()
        try:
            Manifest.from_dict(manifest)
        except FormatError as error:
            raise ExportError(
                f"the package's manifest does not fit its own format ({error}); please report this."
            ) from None
        self.write_json(MANIFEST, manifest)
        with _signals_held():  # from here on the export either fails with the old package in place or succeeds
            try:
                old = self._move_into_place()
            except OSError as error:
                raise ExportError(f"cannot move the package into {self.output}: {error.strerror}.") from None
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
        return manifest

    def _move_into_place(self) -> Path | None:
        """Put the partial folder at the output path; returns where the replaced package now is, if any."""
        if not self.output.exists():
            os.rename(self.partial, self.output)
            return None
        if _exchange(self.partial, self.output):
            return self.partial  # the old package, under the partial name the sweep knows
        old = self.output.parent / f".{self.output.name}{REPLACED}{os.getpid()}"
        os.rename(self.output, old)  # dying here leaves the old package aside: the next export moves it back
        os.rename(self.partial, self.output)
        return old

    def discard(self) -> None:
        shutil.rmtree(self.partial, ignore_errors=True)


RENAME_EXCHANGE = 2  # linux/fs.h
RENAME_SWAP = 2  # macOS sys/stdio.h
AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    """Swap two folders in one step: Linux's renameat2 RENAME_EXCHANGE, or macOS's renamex_np RENAME_SWAP,
    whichever the C library has (runtime/engine/native.py); False where neither is there or the file system
    cannot, and the caller falls back to two renames."""
    renameat2 = native.c_function("renameat2", use_errno=True)
    renamex_np = None if renameat2 is not None else native.c_function("renamex_np", use_errno=True)
    if renameat2 is not None:
        renameat2.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint)
        swapped = renameat2(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) == 0
    elif renamex_np is not None:
        renamex_np.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_uint)
        swapped = renamex_np(os.fsencode(a), os.fsencode(b), RENAME_SWAP) == 0
    else:  # a C library older than glibc 2.28, musl without it, Windows, or EDGELM_PORTABLE=1
        return False
    if swapped:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(code, os.strerror(code), str(b))


@contextmanager
def _signals_held():
    """Hold off SIGINT and SIGTERM while the folders move: one that arrives meanwhile is consumed, since by the
    time it could act the new package is in place (or the move failed with an error of its own), and the
    export reports that. Python runs signal handlers in the main thread only, so only there is this needed."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    numbers = [signal.SIGINT, signal.SIGTERM]
    previous = {number: signal.getsignal(number) for number in numbers}
    held = [number for number in numbers if previous[number] is not None]  # None: set outside Python, left alone
    for number in held:
        signal.signal(number, lambda number, frame: None)
    try:
        yield
    finally:
        for number in held:
            signal.signal(number, previous[number])
