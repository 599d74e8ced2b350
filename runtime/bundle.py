"""`edgelm bundle`: a folder that runs a package on a machine with no Python, the `edgelm` command frozen beside it.

    DIR/edgelm/edgelm        the frozen command (PyInstaller, one folder: DIR/edgelm/_internal holds its libraries)
    DIR/models/NAME/         the package, in a store of its own: the frozen command uses it when no -m is given

The freeze runs in a virtual environment made for it (DIR/.build, removed at the end), holding only the runtime's
dependencies, the server extra and PyInstaller, at the versions installed here where they are: so torch, onnx,
pytest or anything else of the environment that runs `edgelm bundle` cannot reach the bundle. The runtime itself
is copied in from where it is imported (with its distribution's metadata, for `edgelm --version` and the
PyInstaller hook it registers). Building needs PyPI (or a pip configured with a mirror); running the bundle needs
nothing but the C library of a system like the one it was built on (the same CPU architecture, a glibc as new).
"""

import os
import shutil
import subprocess
import sys
import venv
from importlib import metadata
from pathlib import Path

from .errors import EdgelmError

# what the frozen command imports: the runtime's dependencies (pyproject.toml), the server extra, the freezer
RUNTIME = ("onnxruntime", "numpy", "tokenizers", "click", "huggingface_hub", "jinja2", "tqdm")
SERVER = ("uvicorn", "starlette", "pydantic", "prometheus_client")
FREEZER = "pyinstaller"
NEVER = ("torch", "onnx", "pytest", "transformers", "optimum", "tensorflow", "IPython")  # must not reach the bundle
ENTRY = "from edgelm.runtime.cli.launch import command\n\ncommand()\n"
STORE = "models"


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
    from .package.open import open_package

    package = Path(package)
    opened = open_package(package, verify="full")  # a damaged package is refused before minutes of building
    out = Path(out).expanduser().absolute()
    if out.exists() and any(out.iterdir()):
        if not force:
            raise BundleError(f"{out} exists and is not empty; pass --force to replace it.")
        shutil.rmtree(out)
    work = out / ".build"
    work.mkdir(parents=True)
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


def _environment(work: Path, log) -> str:
    """A fresh virtual environment with the runtime staged in it; returns its Python."""
    log("making a clean virtual environment")
    venv.create(work / "venv", with_pip=True, clear=True)
    bindir = "Scripts" if sys.platform == "win32" else "bin"
    python = str(work / "venv" / bindir / ("python.exe" if sys.platform == "win32" else "python"))
    wanted = [requirement(name) for name in (*RUNTIME, *SERVER)] + [FREEZER]
    log(f"installing {' '.join(wanted)}")
    _run(python, "-m", "pip", "install", "-q", "--disable-pip-version-check", *wanted, cwd=work)
    # the runtime as it is imported here, with its distribution's metadata, on the new environment's path
    staged = work / "site"
    source = Path(__file__).resolve().parent
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
    for name in NEVER:
        options += ["--exclude-module", name]
    return options


def _run(*command, cwd: Path) -> None:
    environ = {**os.environ, "PYINSTALLER_CONFIG_DIR": str(cwd / "pyinstaller-config"), "PIP_NO_INPUT": "1"}
    environ.pop("PYTHONPATH", None)  # nothing of this environment's own path
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, env=environ)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["(no output)"]
        raise BundleError(f"{' '.join(map(str, command[1:4]))} failed: {tail[0][:500]}")
