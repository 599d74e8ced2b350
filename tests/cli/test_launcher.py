"""One entry point: `edgelm` and `python -m edgelm.runtime.cli` both go through the launcher (runtime/cli/launch.py),
huge-page restart included, and the restart says so in one debug line on the "edgelm" logger."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from edgelm.runtime.engine import hugepages
from edgelm.runtime.engine.hugepages import OPT_OUT, TUNABLE, environment_with_huge_pages

# Runs at every interpreter start of the child (through PYTHONPATH), the restarted one included: it reports the
# tunable each start saw and shows the "edgelm" logger's debug lines.
SITECUSTOMIZE = """\
import logging, os, sys
print("start GLIBC_TUNABLES=" + os.environ.get("GLIBC_TUNABLES", ""), file=sys.stderr, flush=True)
handler = logging.StreamHandler(sys.stderr)
handler.setFormatter(logging.Formatter("log %(name)s %(levelname)s %(message)s"))
logging.getLogger("edgelm").addHandler(handler)
logging.getLogger("edgelm").setLevel(logging.DEBUG)
"""


def entry_points() -> dict:
    script = Path(sys.executable).with_name("edgelm")
    command = str(script) if script.exists() else shutil.which("edgelm")
    assert command, "the `edgelm` command is not installed beside this Python: pip install -e . first"
    return {"edgelm": [command], "python -m edgelm.runtime.cli": [sys.executable, "-m", "edgelm.runtime.cli"]}


@pytest.fixture
def child_env(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(SITECUSTOMIZE)
    environ = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", OPT_OUT)}
    return environ | {"PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), environ.get("PYTHONPATH")]))}


def run(command: list, environ: dict) -> subprocess.CompletedProcess:
    return subprocess.run(command, env=environ, capture_output=True, text=True, timeout=180)


@pytest.mark.parametrize("opt_out", [False, True])
def test_both_entry_points_restart_the_same_way(tiny_package_int8, child_env, opt_out):
    environ = child_env | ({OPT_OUT: "0"} if opt_out else {})
    would_restart = (
        environment_with_huge_pages(environ, sys.platform, hugepages.thp_mode(), hugepages.libc_version()) is not None
    )
    seen = {}
    for name, command in entry_points().items():
        done = run([*command, "bench", str(tiny_package_int8), "--runs", "1", "--threads", "1", "--json"], environ)
        assert done.returncode == 0, (name, done.stderr)
        assert json.loads(done.stdout)["package"] == str(tiny_package_int8), name  # ran once, to its end
        starts = [line for line in done.stderr.splitlines() if line.startswith("start ")]
        logged = [line for line in done.stderr.splitlines() if line.startswith("log edgelm")]
        if would_restart:
            assert starts == ["start GLIBC_TUNABLES=", f"start GLIBC_TUNABLES={TUNABLE}"], name
            assert len(logged) == 1 and logged[0].startswith(
                f"log edgelm DEBUG restarting with GLIBC_TUNABLES={TUNABLE}"
            )
        else:
            assert starts == ["start GLIBC_TUNABLES="] and logged == [], name
        seen[name] = (starts, [line.split(" of ")[0] for line in logged])
    assert len(set(map(str, seen.values()))) == 1, seen


def test_both_entry_points_print_the_same(tiny_package, child_env):
    outputs = set()
    for name, command in entry_points().items():
        for args in (["info", str(tiny_package)], ["generate", "Hello", "-m", str(tiny_package), "--seed", "1"]):
            done = run([*command, *args], child_env)
            assert done.returncode == 0, (name, args, done.stderr)
            assert done.stderr.splitlines() == ["start GLIBC_TUNABLES="], (name, args)  # no restart for these
            outputs.add((tuple(args), done.stdout))
    assert len(outputs) == 2  # one output per command line, whichever way it was started


def test_errors_read_the_same_from_both_entry_points(tmp_path, child_env):
    errors = set()
    for name, command in entry_points().items():
        done = run([*command, "bench", str(tmp_path / "absent")], child_env)
        assert done.returncode == 1, name
        lines = [line for line in done.stderr.splitlines() if not line.startswith("start ")]
        assert len(lines) == 1 and lines[0].startswith("Error: ") and "absent" in lines[0], (name, done.stderr)
        errors.add(lines[0])
    assert len(errors) == 1


# A child that runs the launcher as the `edgelm` command does, with an object whose finalizer shows whether Python
# tore the interpreter down, and an atexit function, which must run either way.
EXIT_CHILD = """
import atexit, sys, threading
from edgelm.runtime.cli.launch import command

class Witness:
    def __del__(self):
        print("torn down", flush=True)

witness = Witness()
atexit.register(print, "atexit ran")
if sys.argv[1] == "thread":  # a thread that ends when Python, exiting, stops the main thread: the exit is Python's
    threading.Thread(target=threading.main_thread().join).start()
sys.argv = ["edgelm", *sys.argv[2:]]
command()
"""


@pytest.mark.parametrize("thread", [False, True])
def test_the_command_ends_its_process_without_tearing_python_down(tiny_package, thread):
    args = ["thread" if thread else "plain", "generate", "-m", str(tiny_package), "Hi", "--max-new-tokens", "2"]
    done = subprocess.run([sys.executable, "-c", EXIT_CHILD, *args], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[-2 if thread else -1] == "atexit ran" and lines[0].strip()  # the text came out before it
    assert ("torn down" in lines) == thread


def test_a_failed_command_keeps_its_exit_status_and_message(tmp_path):
    args = ["plain", "generate", "-m", str(tmp_path / "absent"), "Hi"]
    done = subprocess.run([sys.executable, "-c", EXIT_CHILD, *args], capture_output=True, text=True, timeout=180)
    assert done.returncode == 1 and done.stdout.splitlines() == ["atexit ran"]
    assert done.stderr.startswith("Error: no model package at ") and "Traceback" not in done.stderr
