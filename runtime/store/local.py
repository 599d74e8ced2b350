"""The per-user model store: one verified package folder per name, installed atomically, and the one place that
turns a store name or a path into a package folder (resolve_package).

Where it lives: $EDGELM_HOME if set; else %LOCALAPPDATA%\\edgelm\\models on Windows; else
$XDG_DATA_HOME/edgelm/models, or ~/.local/share/edgelm/models.

    STORE/NAME/               a package, every listed file byte for byte as verified against its manifest; the
                              manifest's name is NAME (the model id `edgelm serve` answers to), written into it
                              when the package is installed under another name (`--name`)
    STORE/.meta/NAME.json     where it came from (hub repo and commit, or archive file or URL), beside the package
                              so the package's own checksums stay valid
    STORE/.meta/config.json   {"default": NAME}, written by `edgelm default NAME`
    STORE/.tmp-PID-*          an install in progress: removed when it ends, whatever the outcome
    STORE/.pull-*             an interrupted hub download; the same `edgelm pull` resumes it

Only the visible NAME folders are packages. An install fills a hidden .tmp- folder, verifies it, then renames it
to NAME: a reader sees no package or the whole verified one, never a part, and a failed install leaves the
visible store as it was.
"""

import errno
import hashlib
import importlib.util
import json
import os
import re
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from .. import untrusted
from ..errors import EdgelmError, PackageError, StoreError
from ..package.onnxruntime_compat import check_installed
from ..package.format import MANIFEST, MAX_MANIFEST_BYTES, FormatError, Manifest
from ..package.open import DEFAULT_PACKAGE, Package, open_package
from .staging import remove_tree, sweep_dead, take_over

EXPORTED = DEFAULT_PACKAGE.parent  # models/: edgelm export's default output folder, relative to the current folder
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")  # a store name, and a package file name inside a package
WINDOWS_DEVICES = {"con", "prn", "aux", "nul", *(f"com{i}" for i in range(10)), *(f"lpt{i}" for i in range(10))}
MANIFEST_LIMIT = MAX_MANIFEST_BYTES
RECORD_LIMIT = 1 << 20  # STORE/.meta/NAME.json (where a package came from) and config.json: a few hundred bytes
META, TEMP, PULL, TRASH = ".meta", ".tmp-", ".pull-", ".trash-"


def store_dir() -> Path:
    """The store folder (it may not exist yet)."""
    if os.environ.get("EDGELM_HOME"):
        return Path(os.environ["EDGELM_HOME"]).expanduser()
    if sys.platform == "win32":
        return Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local") / "edgelm" / "models"
    return Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share") / "edgelm" / "models"


def check_name(name) -> str:
    """A package name is one plain folder name on every OS: letters, digits, '.', '_', '-', not hidden."""
    if (
        not isinstance(name, str)
        or not NAME.fullmatch(name)
        or name.endswith(".")
        or name.split(".")[0].lower() in WINDOWS_DEVICES
    ):
        raise StoreError(
            f"{name!r} is not a valid package name: use up to 100 letters, digits, '.', '_' and '-', starting with a letter or digit."
        )
    return name


@dataclass(frozen=True)
class Installed:
    """One package in the store, as `edgelm list` shows it."""

    name: str
    folder: Path
    manifest: Manifest | None  # None: unreadable
    source: dict  # {"hub": repo, "revision": ..., "commit": ...} or {"archive": file or URL, "sha256": ...}
    size: int  # bytes on disk

    @property
    def recipe(self) -> str:
        if not self.manifest:
            return f"damaged (unreadable manifest): edgelm rm {self.name}"
        return f"{self.manifest.weights.dtype} weights, {self.manifest.graph.kv_cache_dtype} KV cache"

    @property
    def source_text(self) -> str:
        s = self.source
        if "hub" in s:
            return f"hf:{s['hub']}@{(s.get('commit') or s.get('revision') or '')[:12]}"
        return s.get("archive", "unknown")


def installed() -> list[Installed]:
    """Every package in the store, by name."""
    root = store_dir()
    if not root.is_dir():
        return []
    found = []
    for folder in sorted(root.iterdir()):
        if folder.name.startswith(".") or not folder.is_dir() or not (folder / MANIFEST).is_file():
            continue
        try:
            manifest = open_package(folder, verify=False).manifest
        except PackageError:
            manifest = None
        found.append(Installed(folder.name, folder, manifest, _read_record(folder.name), _folder_size(folder)))
    return found


def names() -> list[str]:
    return [p.name for p in installed()]


def find(name: str) -> Path:
    """The folder of an installed package; StoreError naming what is installed when there is none by that name."""
    folder = store_dir() / check_name(name)
    if not (folder / MANIFEST).is_file():
        raise StoreError(f"no package named {name!r} in the store ({store_dir()}). {_what_is_installed()}")
    return folder


def remove(name: str) -> None:
    """Delete an installed package (and its record); the default is cleared if it named it."""
    folder = find(name)
    trash = store_dir() / f"{TRASH}{os.getpid()}-{name}"
    with store_writes():
        os.rename(folder, trash)  # one step: the package is there or gone, never half-deleted
        remove_tree(trash)
        (store_dir() / META / f"{name}.json").unlink(missing_ok=True)
        if get_default() == name:
            _write_json(store_dir() / META / "config.json", {k: v for k, v in _config().items() if k != "default"})


def set_default(name: str) -> None:
    """Make an installed package the one commands open when given none."""
    find(name)
    with store_writes():
        _write_json(store_dir() / META / "config.json", _config() | {"default": name})


def get_default() -> str | None:
    return _config().get("default")


def names_a_package(text) -> bool:
    """Whether `text` names a package beyond doubt: a folder holding a manifest.json (or an optimum export's
    model.onnx), or an installed name. The command line uses it to tell a package from a prompt."""
    if not isinstance(text, str) or not text or len(text) > 4096 or "\n" in text or "\0" in text:
        return False
    try:
        folder = Path(text).expanduser()
        if folder.is_dir() and ((folder / MANIFEST).is_file() or (folder / "model.onnx").is_file()):
            return True
        return bool(NAME.fullmatch(text)) and any((where / text / MANIFEST).is_file() for where in _name_folders())
    except (OSError, ValueError):  # a name too long for the file system, say
        return False


def resolve_package(name_or_path=None) -> Path:
    """The package folder a command means: an existing path is that path; else an installed name; with nothing
    given, the default (`edgelm default NAME`), else the one installed package, else models/distilgpt2.
    Every command and load() resolve through here."""
    if name_or_path is not None:
        path = Path(name_or_path).expanduser()
        if path.exists():
            return path
        text = str(name_or_path)
        if NAME.fullmatch(text):
            for where in _name_folders():
                if (where / text / MANIFEST).is_file():
                    return where / text
            raise PackageError(
                f"no package folder {text!r} here, none in {EXPORTED}/ and no package by that name in the store. "
                f"{_what_is_installed()}"
            )
        raise PackageError(f"no model package at {path}. {how_to_get_one()}")
    default = get_default()
    if default is not None:
        if (store_dir() / default / MANIFEST).is_file():
            return store_dir() / default
        raise PackageError(
            f"the default package {default!r} is no longer installed. Choose another: edgelm default NAME. {_what_is_installed()}"
        )
    available = names()
    if len(available) == 1:
        return store_dir() / available[0]
    if DEFAULT_PACKAGE.is_dir():
        return DEFAULT_PACKAGE
    if available:
        raise PackageError(
            f"{len(available)} packages are installed ({', '.join(available)}); name one, or set a default: edgelm default NAME"
        )
    raise PackageError(
        f"no model package on this machine (no default set, none installed in {store_dir()}, no {DEFAULT_PACKAGE} here). {how_to_get_one()}"
    )


def _name_folders() -> tuple:
    """Where a package's name is looked up, in order: the store, then the folder edgelm export writes to."""
    return store_dir(), EXPORTED


def how_to_get_one() -> str:
    """The ways to get a package that work here: the export only where its extra is installed."""
    ways = "edgelm pull REPO (from the Hugging Face hub), edgelm install FILE_OR_URL (an archive made by edgelm pack)"
    if importlib.util.find_spec("torch") and importlib.util.find_spec("transformers"):
        ways += ", or edgelm export distilgpt2"
    return f"Get one with: {ways}."


# --- installing ----------------------------------------------------------------------------------------


def read_manifest(data: bytes, where: str) -> Manifest:
    """Parse a manifest that came from outside and check it against the package format, all of it (every listed
    file a plain name in the package folder, with its size and sha256)."""
    try:
        return Manifest.from_dict(json.loads(data.decode("utf-8")))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        raise PackageError(
            f"{where} is not an edgelm package manifest; only packages made by edgelm export install."
        ) from None
    except FormatError as error:
        advice = error.advice or "Nothing was installed."
        raise PackageError(f"{where} is not an edgelm package this edgelm can install: {error}. {advice}") from None


def check_package(folder: Path) -> Package:
    """Refuse a folder unless it is an edgelm package whose every file is listed, regular and matches its sha256."""
    if not (folder / MANIFEST).is_file():
        raise PackageError(f"{folder} has no {MANIFEST}: it is not an edgelm package.")
    manifest = read_manifest_file(folder / MANIFEST)
    for entry in folder.iterdir():
        if entry.is_symlink() or not entry.is_file():
            raise PackageError(f"{entry} is not a regular file; a package holds only the files its manifest lists.")
        if entry.name != MANIFEST and entry.name not in manifest.files:
            raise PackageError(f"{entry} is not listed in the package's manifest; edgelm installs only verified files.")
    return open_package(folder, verify=True)


def refuse_taken(name: str, force: bool) -> None:
    if (store_dir() / check_name(name)).exists() and not force:
        raise StoreError(
            f"a package named {name!r} is already installed; pass --force to replace it, or --name to install beside it."
        )


def free_space() -> int:
    """Bytes free where the store is (what a download may take at most)."""
    import shutil  # only here: bz2 and lzma come with it, and a load writes nothing to the store

    root = store_dir()
    root.mkdir(parents=True, exist_ok=True)
    return shutil.disk_usage(root).free


def check_free_space(needed: int) -> None:
    root, free = store_dir(), free_space()
    if free < needed:
        raise StoreError(
            f"not enough disk space in {root}: the package needs {needed / 1e6:.1f} MB, {free / 1e6:.1f} MB are free. Free some space and run again."
        )


@contextmanager
def staging():
    """A hidden work folder inside the store (same file system, so the final rename is atomic), always removed."""
    import tempfile  # only here: a load writes nothing to the store

    with store_writes():
        root = store_dir()
        root.mkdir(parents=True, exist_ok=True)
        sweep_dead(root, (TEMP, TRASH))  # staging folders, and packages a killed removal put aside
        work = Path(tempfile.mkdtemp(prefix=f"{TEMP}{os.getpid()}-", dir=root))
    try:
        with store_writes():
            yield work
    finally:
        remove_tree(work)


@contextmanager
def store_writes(discard: Path | None = None):
    """Turn a failed write into one line; a full disk says so. `discard` is removed first (a partial download
    would only hold on to the space the user must free)."""
    try:
        yield
    except OSError as error:
        if discard is not None:
            remove_tree(discard)
        if error.errno == errno.ENOSPC:
            raise StoreError(
                f"the disk filled up while installing into {store_dir()}; free some space and run again. The store is unchanged."
            ) from None
        raise StoreError(
            f"cannot write to the store {store_dir()}: {error.strerror or error}. The store is unchanged."
        ) from None


def pull_folder(repo_id: str) -> Path:
    """Where this process's hub download of repo_id collects (.pull-HASH-PID: two pulls never share one). It is
    kept across an interruption: a later pull of the repo takes over the folder of one whose process is gone,
    and so resumes it."""
    return take_over(store_dir(), f"{PULL}{hashlib.sha256(repo_id.encode()).hexdigest()[:16]}-")


def install_folder(folder: Path, name: str, source: dict, force: bool = False) -> Installed:
    """Verify a filled staging folder and rename it into the store as NAME, recording its source beside it."""
    refuse_taken(name, force)
    package = check_package(folder)
    # no install that cannot run here
    check_installed(package.min_onnxruntime, f"the package {package.name!r}", package.uses)
    manifest = _name_package(folder, package.manifest, name)
    root, target = store_dir(), store_dir() / name
    record = root / META / f".{name}.json{TEMP}{os.getpid()}"
    replaced = root / f"{TRASH}{os.getpid()}-{name}"
    with store_writes():
        _write_json(record, source | {"installed": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}, replace=False)
    try:
        with store_writes():
            if force and target.exists():
                os.rename(target, replaced)
            try:
                # onto a package folder (never empty) this fails: the rename is the name check
                os.rename(folder, target)
            except OSError as error:
                if replaced.exists():
                    os.rename(replaced, target)
                if not force and target.exists() and error.errno in (errno.EEXIST, errno.ENOTEMPTY, errno.EACCES):
                    raise StoreError(
                        f"a package named {name!r} was installed meanwhile; pass --force to replace it, or choose another --name."
                    ) from None
                raise
            os.replace(record, root / META / f"{name}.json")
    finally:
        record.unlink(missing_ok=True)
        remove_tree(replaced)
    return Installed(name, target, manifest, _read_record(name), _folder_size(target))


def _name_package(folder: Path, manifest: Manifest, name: str) -> Manifest:
    """Make the store name the package's name: a package installed under another name than its manifest's gets
    NAME written into its (already verified) manifest. Only `name` changes; the listed files and their sha256
    stay as verified, so the package answers to NAME everywhere (edgelm info, serve's model id, pack)."""
    if manifest.name == name:
        return manifest
    with store_writes():
        data = json.loads(untrusted.read_bytes(folder / MANIFEST, MANIFEST_LIMIT, StoreError))
        _write_json(folder / MANIFEST, data | {"name": name})
    return replace(manifest, name=name)


def _folder_size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file())


def read_manifest_file(path: Path, where: str | None = None) -> dict:
    """read_manifest on a file, read only up to MANIFEST_LIMIT bytes."""
    data = untrusted.read_bytes(path, MANIFEST_LIMIT, PackageError, what="a package manifest")
    return read_manifest(data, where or str(path))


def _what_is_installed() -> str:
    available = names()
    if available:
        return f"Installed: {', '.join(available)}."
    return f"The store is empty. {how_to_get_one()}"


def _read_record(name: str) -> dict:
    try:
        record = json.loads(untrusted.read_bytes(store_dir() / META / f"{name}.json", RECORD_LIMIT))
    except (EdgelmError, ValueError, RecursionError):
        return {}
    return record if isinstance(record, dict) else {}


def _config() -> dict:
    try:
        config = json.loads(untrusted.read_bytes(store_dir() / META / "config.json", RECORD_LIMIT))
    except (EdgelmError, ValueError, RecursionError):
        return {}
    return config if isinstance(config, dict) else {}


def _write_json(path: Path, data: dict, replace: bool = True) -> None:
    """Write a small JSON file whole: into a temporary name, then renamed over the old one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial-{os.getpid()}") if replace else path
    partial.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    if replace:
        os.replace(partial, path)
