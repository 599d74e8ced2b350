"""`edgelm bundle`: a folder that runs a package on a machine with no Python, the `edgelm` command frozen beside it.

    DIR/edgelm/edgelm        the frozen command (PyInstaller, one folder: DIR/edgelm/_internal holds its libraries)
    DIR/models/NAME/         the package, in a store of its own: the frozen command uses it when no -m is given

The freeze runs in a virtual environment made for it (DIR/.build, removed at the end), holding only the runtime's
dependencies, the server extra, llguidance (constrained generation, where it has a wheel: the build says when
it leaves it out) and PyInstaller, at the versions installed here where they are: so torch, onnx,
pytest or anything else of the environment that runs `edgelm bundle` cannot reach the bundle. The runtime itself
is copied in from where it is imported (with its distribution's metadata, for `edgelm --version` and the
PyInstaller hook it registers). Building needs PyPI (or a pip configured with a mirror); running the bundle needs
nothing but the C library of a system like the one it was built on (the same CPU architecture, a glibc as new).

The folder is written only where it cannot destroy what edgelm did not make: `DIR/.edgelm-bundle` (MARK) is the
first file written in it, and `force` replaces only a folder that holds that mark. DIR is never a link, the current,
home or root folder, a folder that holds the package, or one inside it, whatever `force` says.
"""

import os
import shutil
import subprocess
import sys
import venv
from importlib import metadata
from pathlib import Path

from .. import untrusted
from ..errors import EdgelmError

# what the frozen command imports: the runtime's dependencies (pyproject.toml), the server extra, the freezer
RUNTIME = ("onnxruntime", "numpy", "tokenizers", "click", "huggingface_hub", "jinja2", "tqdm")
SERVER = ("uvicorn", "starlette", "pydantic", "prometheus_client")
CONSTRAINED = "llguidance"  # structured output and forced tool calls; compiled wheels for the common platforms only
FREEZER = "pyinstaller"
NEVER = ("torch", "onnx", "pytest", "transformers", "optimum", "tensorflow", "IPython")  # must not reach the bundle
ENTRY = "from edgelm.runtime.cli.launch import command\n\ncommand()\n"
STORE = "models"
MARK = ".edgelm-bundle"  # the first file of a bundle's folder: what --force may replace
MARK_TEXT = "a folder made by edgelm bundle; edgelm bundle --force may replace it\n"


class BundleError(EdgelmError):
    """The bundle could not be built: the message says which step failed and why."""


def requirement(name: str) -> str:
    """`name==version` where it is installed here (the bundle runs what was tested), else `name`."""
    try:
        return f"{name}=={metadata.version(name)}"
    except metadata.PackageNotFoundError:
        return name


def build_bundle(package: Path, out: Path, force: bool = False, log=lambda line: None) -> Path:
    """Freeze `edgelm` and copy the package folder `package` into the new folder `out`; returns the executable.
    `log(line)` is told each step."""
    from ..package.open import open_package

    package = Path(package)
    opened = open_package(package, verify="full")  # a damaged package is refused before minutes of building
    out = output_folder(out, opened.folder)
    if out.exists() and any(out.iterdir()):
        if not force:
            raise BundleError(f"{out} exists and is not empty; pass --force to replace it.")
        if not made_here(out):
            raise BundleError(
                f"{out} was not made by edgelm bundle (it has no {MARK}), so --force does not replace it: name a "
                "new folder, or empty this one yourself."
            )
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / MARK).write_text(MARK_TEXT, encoding="utf-8")  # first: a build that fails is still ours to replace
    work = out / ".build"
    work.mkdir()
    try:
        python = _environment(work, log)
        log("freezing edgelm (PyInstaller)")
        _run(python, "-m", "PyInstaller", *_pyinstaller_options(work), str(work / "edgelm_main.py"), cwd=work)
        executable = out / "edgelm" / ("edgelm.exe" if sys.platform == "win32" else "edgelm")
        leaked = [name for name in NEVER if (out / "edgelm" / "_internal" / name).exists()]
        if leaked:
            raise BundleError(f"the frozen command picked up {', '.join(leaked)}; it must hold the runtime only")
        log(f"copying the package {opened.name}")
        shutil.copytree(opened.folder, out / STORE / opened.name, symlinks=False)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return executable


def output_folder(out, package: Path) -> Path:
    """The bundle's folder, `out` made absolute; BundleError where writing or replacing it could destroy what
    edgelm did not make: an empty name (an unset variable: the current folder), a link, a file, the current,
    home or root folder, a folder that holds the package or one inside it."""
    if not str(out).strip():
        raise BundleError('the output folder is empty (-o ""); name a new folder for the bundle.')
    given = Path(out).expanduser()
    if given.is_symlink():
        raise BundleError(f"{given} is a symbolic link; name the bundle's folder itself, not a link to it.")
    if given.exists() and not given.is_dir():
        raise BundleError(f"{given} is a file; name a folder for the bundle.")
    real, held = given.resolve(), Path(package).resolve()
    if held.is_relative_to(real) or real.is_relative_to(held):
        raise BundleError(f"{given} holds the package {held} or is inside it; name a folder apart from the package.")
    if real in (Path.cwd().resolve(), _home(), Path(real.anchor)):
        raise BundleError(f"{given} is the current, home or root folder; name a new folder for the bundle.")
    return given.absolute()


def _home() -> Path | None:
    try:
        return Path.home().resolve()
    except (RuntimeError, KeyError, OSError):  # no home folder known: nothing to compare with
        return None


def made_here(folder: Path) -> bool:
    """Whether `folder` holds the mark edgelm bundle writes first (a regular file, not a link, of MARK_TEXT)."""
    mark = folder / MARK
    if mark.is_symlink():
        return False
    try:
        return untrusted.read_text(mark, len(MARK_TEXT)) == MARK_TEXT
    except EdgelmError:
        return False


def _environment(work: Path, log) -> str:
    """A fresh virtual environment with the runtime staged in it; returns its Python."""
    log("making a clean virtual environment")
    venv.create(work / "venv", with_pip=True, clear=True)
    bindir = "Scripts" if sys.platform == "win32" else "bin"
    python = str(work / "venv" / bindir / ("python.exe" if sys.platform == "win32" else "python"))
    wanted = [requirement(name) for name in (*RUNTIME, *SERVER)] + [FREEZER]
    log(f"installing {' '.join(wanted)}")
    _run(python, "-m", "pip", "install", "-q", "--disable-pip-version-check", *wanted, cwd=work)
    try:
        _run(python, "-m", "pip", "install", "-q", "--disable-pip-version-check", requirement(CONSTRAINED), cwd=work)
    except BundleError as error:  # no wheel for this platform: the bundle runs, without constrained generation
        log(f"left out {CONSTRAINED}: the bundle has no json_schema, regex, grammar, choices or forced tool calls ({error})")
    # the runtime as it is imported here, with its distribution's metadata, on the new environment's path
    staged = work / "site"
    source = Path(__file__).resolve().parents[1]  # runtime/, above apps/
    shutil.copytree(source, staged / "edgelm" / "runtime", ignore=shutil.ignore_patterns("__pycache__"))
    distribution = metadata.distribution("edgelm")
    info = getattr(distribution, "_path", None)
    if info is not None and Path(info).is_dir():
        shutil.copytree(info, staged / Path(info).name)
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(site) / "edgelm-bundle.pth").write_text(f"{staged}\n", encoding="utf-8")
    (work / "edgelm_main.py").write_text(ENTRY, encoding="utf-8")
    return python


def _pyinstaller_options(work: Path) -> list[str]:
    options = ["--onedir", "--noconfirm", "--noupx", "--log-level", "WARN", "--name", "edgelm"]
    options += ["--distpath", str(work.parent), "--workpath", str(work / "build"), "--specpath", str(work)]
    # runtime/__init__.py's lazy names and the lazily loaded commands are listed by edgelm's hook; the server
    # (which that hook leaves to apps that import it) is part of the command
    for name in ("edgelm.runtime", "edgelm.runtime.server", "uvicorn"):
        options += ["--collect-submodules", name]
    options += ["--copy-metadata", "edgelm"]
    if (work / "venv").is_dir() and _has(work, CONSTRAINED):  # imported lazily, so PyInstaller's scan misses it
        options += ["--collect-all", CONSTRAINED]
    for name in NEVER:
        options += ["--exclude-module", name]
    return options


def _has(work: Path, module: str) -> bool:
    """Whether the bundle's environment in `work` can import `module`."""
    bindir = "Scripts" if sys.platform == "win32" else "bin"
    python = work / "venv" / bindir / ("python.exe" if sys.platform == "win32" else "python")
    probe = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) is None)"
    return subprocess.run([str(python), "-c", probe], capture_output=True).returncode == 0


def _run(*command, cwd: Path) -> None:
    environ = {**os.environ, "PYINSTALLER_CONFIG_DIR": str(cwd / "pyinstaller-config"), "PIP_NO_INPUT": "1"}
    environ.pop("PYTHONPATH", None)  # nothing of this environment's own path
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, env=environ)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["(no output)"]
        raise BundleError(f"{' '.join(map(str, command[1:4]))} failed: {tail[0][:500]}")
