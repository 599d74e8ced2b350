"""A desktop app that embeds the runtime freezes with PyInstaller and runs: edgelm ships its hook
(runtime/_pyinstaller, the pyinstaller40 entry point), which lists the modules runtime/__init__.py imports lazily.
`edgelm bundle` freezes the command itself beside a package, for a machine with no Python.

Both freeze in a clean virtual environment they make (runtime/apps/bundle.py: the runtime's dependencies and
PyInstaller from PyPI), never in the one running the tests, so neither depends on PyInstaller being installed
here, and what the environment running the tests holds (torch, onnx, pytest) cannot reach the frozen app."""

import json
import os
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

APP = """\
import sys
import edgelm.runtime as edgelm

model = edgelm.load(sys.argv[1], device="cpu")
print(model.generate(sys.argv[2], max_new_tokens=8, do_sample=False).token_ids)
"""


def _no_python_environ(tmp_path: Path) -> dict:
    """An environment whose PATH finds no python (an empty folder), as on a machine without one."""
    empty = tmp_path / "empty-bin"
    empty.mkdir(exist_ok=True)
    return {"PATH": str(empty), "HOME": str(tmp_path), "LANG": "C.UTF-8"}


@pytest.mark.slow
def test_a_frozen_app_loads_a_package_and_generates(tiny_package, tmp_path):
    from edgelm.runtime.apps.bundle import _environment, _run

    work = tmp_path / "work"
    work.mkdir()
    python = _environment(work, lambda line: None)  # its edgelm is the runtime alone: the hook is registered
    (work / "app.py").write_text(APP)
    _run(python, "-m", "PyInstaller", "--onedir", "--noupx", "--noconfirm", "--log-level", "WARN",
         "--distpath", str(tmp_path / "dist"), "--workpath", str(work / "build"), "--specpath", str(work),
         str(work / "app.py"), cwd=work)  # fmt: skip
    internal = tmp_path / "dist" / "app" / "_internal"
    assert not [name for name in ("torch", "onnx", "pytest") if (internal / name).exists()]

    frozen = subprocess.run(
        [str(tmp_path / "dist" / "app" / "app"), str(tiny_package), "Hello, my name is"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, env=_no_python_environ(tmp_path),
    )  # fmt: skip
    assert frozen.returncode == 0, frozen.stderr
    import edgelm.runtime as rt

    expected = rt.load(tiny_package, device="cpu").generate("Hello, my name is", max_new_tokens=8, do_sample=False)
    assert frozen.stdout.strip() == str(expected.token_ids)


@pytest.fixture(scope="module")
def bundle(tiny_package_int8, tmp_path_factory):
    from click.testing import CliRunner
    from edgelm.runtime.cli.main import main

    out = tmp_path_factory.mktemp("bundle") / "edgelm-tiny"
    made = CliRunner().invoke(main, ["bundle", "-m", str(tiny_package_int8), "-o", str(out)])
    assert made.exit_code == 0, made.output
    return out


@pytest.mark.slow
def test_a_bundle_generates_chats_and_serves_with_no_python(bundle, tiny_package_int8, tmp_path):
    import edgelm.runtime as rt

    executable = bundle / "edgelm" / "edgelm"
    internal = bundle / "edgelm" / "_internal"
    assert not [name for name in ("torch", "onnx", "pytest", "transformers") if (internal / name).exists()]
    assert (bundle / "models" / "tiny-int8" / "manifest.json").exists()
    environ = _no_python_environ(tmp_path)  # and another working folder: the bundle finds its own package
    run = lambda *args, **kw: subprocess.run(  # noqa: E731
        [str(executable), *args], capture_output=True, text=True, timeout=120, cwd=tmp_path, env=environ, **kw
    )
    generated = run("generate", "Hello, my name is", "--max-new-tokens", "8", "--json")
    assert generated.returncode == 0, generated.stderr
    expected = rt.load(tiny_package_int8).generate("Hello, my name is", max_new_tokens=8)
    assert json.loads(generated.stdout)["token_ids"] == list(expected.token_ids)
    chatted = run("chat", "--max-new-tokens", "4", input="Hi there\n")
    assert chatted.returncode == 0 and chatted.stdout.strip(), chatted.stderr
    # llguidance is bundled: structured output works with no Python
    chosen = run("generate", "Pick: ", "--choice", "yes", "--choice", "no", "--json")
    assert chosen.returncode == 0, chosen.stderr
    assert json.loads(chosen.stdout)["text"] in ("yes", "no")

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [str(executable), "serve", "--port", str(port)], cwd=tmp_path, env=environ,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        body = b'{"prompt": "Hello", "max_tokens": 4}'
        for _ in range(300):
            try:
                request = urllib.request.Request(
                    f"http://127.0.0.1:{port}/v1/completions", body, {"Content-Type": "application/json"}
                )
                with urllib.request.urlopen(request, timeout=30) as response:
                    assert response.status == 200 and b'"model":"tiny-int8"' in response.read().replace(b" ", b"")
                break
            except OSError:
                assert server.poll() is None, server.stdout.read()
                time.sleep(0.1)
        else:
            pytest.fail("the bundled server did not answer")
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_bundle_refuses_a_folder_in_use_and_a_damaged_package(tiny_package, tmp_path):
    """Both before anything is built (no environment is made, nothing is downloaded)."""
    import shutil

    from click.testing import CliRunner
    from edgelm.runtime.cli.main import main

    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "file").touch()
    taken = CliRunner().invoke(main, ["bundle", "-m", str(tiny_package), "-o", str(tmp_path / "taken")])
    assert taken.exit_code == 1 and "is not empty; pass --force" in taken.output
    damaged = shutil.copytree(tiny_package, tmp_path / "damaged")
    with open(damaged / "tokenizer.json", "r+b") as f:
        f.write(b"X")
    refused = CliRunner().invoke(main, ["bundle", "-m", str(damaged), "-o", str(tmp_path / "out")])
    assert refused.exit_code == 1 and "does not match its sha256" in refused.output
    assert not (tmp_path / "out").exists() and "Traceback" not in refused.output
    assert os.listdir(tmp_path / "taken") == ["file"]


@pytest.mark.slow
def test_the_node_sidecar_recipe_runs_the_bundle(bundle, tmp_path):
    """examples/sidecar.mjs, as docs/apps.md tells an Electron-style app to use the bundle, with no Python."""
    import shutil

    node = shutil.which("node")
    assert node, "node is needed for the app recipe's test"
    example = Path(__file__).resolve().parents[2] / "examples" / "sidecar.mjs"
    environ = _no_python_environ(tmp_path)
    done = subprocess.run([node, str(example), str(bundle / "edgelm" / "edgelm")], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path, env=environ)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    out = dict(line.split(": ", 1) for line in done.stdout.splitlines())
    assert out["ready"].startswith("tiny-int8 at http://127.0.0.1:") and out["stopped"] == "exit code 0"
    assert set(json.loads(out["structured"])) == {"city", "days"}
