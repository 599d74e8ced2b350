"""A desktop app that embeds the runtime freezes with PyInstaller and runs: edgelm ships its hook
(runtime/_pyinstaller, the pyinstaller40 entry point), which lists the modules runtime/__init__.py imports lazily."""

import os
import shutil
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

RUNTIME = Path(__file__).resolve().parents[1] / "runtime"

APP = """\
import sys
import edgelm.runtime as edgelm

model = edgelm.load(sys.argv[1], device="cpu")
print(model.generate(sys.argv[2], max_new_tokens=8, do_sample=False).token_ids)
"""


@pytest.mark.slow
def test_a_frozen_app_loads_a_package_and_generates(tiny_package, tmp_path):
    try:
        import PyInstaller  # noqa: F401
    except ImportError:
        pytest.fail("freezing needs PyInstaller: pip install -e '.[freeze]'")
    registered = {point.value for point in entry_points(group="pyinstaller40")}
    assert "edgelm.runtime._pyinstaller:get_hook_dirs" in registered, (
        "PyInstaller cannot find edgelm's hook: reinstall edgelm (pip install -e '.[freeze]') to register it"
    )
    # The runtime laid out as a regular install has it (edgelm/runtime/...): PyInstaller cannot follow the import
    # hook of an editable install.
    source = tmp_path / "src"
    shutil.copytree(RUNTIME, source / "edgelm" / "runtime", ignore=shutil.ignore_patterns("__pycache__"))
    app = tmp_path / "app.py"
    app.write_text(APP)
    environ = os.environ | {"PYINSTALLER_CONFIG_DIR": str(tmp_path / "config")}
    built = subprocess.run(
        [sys.executable, "-m", "PyInstaller", "--onedir", "--noupx", "--noconfirm", "--log-level", "WARN"]
        + ["--distpath", str(tmp_path / "dist"), "--workpath", str(tmp_path / "build"), "--specpath", str(tmp_path)]
        + ["--paths", str(source), str(app)],
        capture_output=True,
        text=True,
        timeout=600,
        env=environ,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    assert not (tmp_path / "dist" / "app" / "_internal" / "torch").exists()  # the runtime's app stays torch-free

    frozen = subprocess.run(
        [str(tmp_path / "dist" / "app" / "app"), str(tiny_package), "Hello, my name is"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert frozen.returncode == 0, frozen.stderr
    import edgelm.runtime as rt

    expected = rt.load(tiny_package, device="cpu").generate("Hello, my name is", max_new_tokens=8, do_sample=False)
    assert frozen.stdout.strip() == str(expected.token_ids)
