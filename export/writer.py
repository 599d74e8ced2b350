"""Stage 6, save: write the package folder atomically and describe it in manifest.json.

Everything is written into a hidden sibling folder first (`.NAME.partial-PID`); only a complete folder,
manifest last, is renamed into place. An export stopped at any point leaves no folder that looks like a
package, and the next export to the same place sweeps up partial folders whose process is gone.
"""

import errno
import json
import os
import shutil
import time
from pathlib import Path

from edgelm.runtime.errors import ExportError
from dataclasses import replace

from edgelm.runtime.package import file_record
from edgelm.runtime.package_format import MANIFEST, FileRecord, FormatError, Manifest

PARTIAL = ".partial-"


def refuse_existing(output: Path, force: bool) -> None:
    """A file in the way, or a non-empty folder without --force: cheap, so checked before the slow stages too."""
    if output.exists() and not output.is_dir():
        raise ExportError(f"{output} exists and is a file; choose another output folder.")
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
    """Remove partial folders for this output left by exports that no longer run."""
    for folder in output.parent.glob(f".{output.name}{PARTIAL}*"):
        pid = folder.name.rsplit(PARTIAL, 1)[-1]
        if not pid.isdigit() or not _alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class PackageWriter:
    """Collects files in a partial folder, then publishes them with one rename."""

    def __init__(self, output: Path):
        self.output = output
        self.partial = output.parent / f".{output.name}{PARTIAL}{os.getpid()}"
        shutil.rmtree(self.partial, ignore_errors=True)
        self.partial.mkdir(parents=True)

    def write_bytes(self, name: str, data: bytes) -> None:
        self._guard(name, lambda path: path.write_bytes(data))

    def write_json(self, name: str, data: dict) -> None:
        self.write_bytes(name, (json.dumps(data, indent=2, sort_keys=False) + "\n").encode())

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
        old = None
        if self.output.exists():
            old = self.output.parent / f".{self.output.name}.replaced-{os.getpid()}"
            os.rename(self.output, old)
        os.rename(self.partial, self.output)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        return manifest

    def discard(self) -> None:
        shutil.rmtree(self.partial, ignore_errors=True)
