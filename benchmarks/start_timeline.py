"""When each thread of `edgelm generate -m PKG "Hello" --max-new-tokens 1` does what, from the process's start to
its first token, checkouts taking turns round by round.

    python benchmarks/start_timeline.py PKG [--base CHECKOUT ...] [--rounds 8]

Each round starts the command once per checkout (this one, and each --base, run with this interpreter as
start_to_first_token.py runs them), in a fresh process whose modules are watched as they are imported: the
first and last call of the functions that make the start (the package's checks, the session's creation and its
onnxruntime initialize_session, the tokenizer's build) and the end of the imports of click, the command's module
and the engine's decode loop, each as milliseconds since the parent started the process. The parent adds the
first byte on stdout (the token) and the exit. Printed: per checkout, the median of each mark over the rounds
(the first round a warm-up, not counted). What it shows is the order: which thread waits for which.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from start_to_first_token import base_path  # noqa: E402

# The child: the command run in this process, its functions wrapped wherever a module of edgelm.runtime defines
# them (the checkouts differ in which module that is), its marks printed to stderr as JSON at exit.
CHILD = r"""
import atexit, importlib.util, json, sys, time
marks = {}
def mark(name):
    marks.setdefault(name, time.time())
def mark_last(name):
    marks[name] = time.time()
CALLS = {"open_package": "package opened", "create_session": "session", "load_tokenizer": "tokenizer built"}
IMPORTS = ("click", "edgelm.runtime.cli.main", "edgelm.runtime.engine.decode")
def wrapped(function, what):
    def call(*args, **kwargs):
        mark(f"{what}: called")
        try:
            return function(*args, **kwargs)
        finally:
            mark_last(f"{what}: returned")
    return call
def watching(make):  # _initializing(event) -> the session thread's profile function
    def made(event):
        inner = make(event)
        def watch(frame, kind, called):
            if kind == "c_call" and getattr(called, "__name__", "") == "initialize_session":
                mark("session: initialize_session called")
            return inner(frame, kind, called)
        return watch
    return made
def patch(module):
    for name, what in CALLS.items():
        function = getattr(module, name, None)
        if callable(function) and getattr(function, "__module__", None) == module.__name__:
            setattr(module, name, wrapped(function, what))
    if callable(getattr(module, "_initializing", None)):
        module._initializing = watching(module._initializing)
busy = set()
class Hook:
    def find_spec(self, name, path=None, target=None):
        if name in busy or not (name.startswith("edgelm.runtime") or name in IMPORTS):
            return None
        busy.add(name)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            busy.discard(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module
        def exec_module(module):
            run(module)
            patch(module)
            if name in IMPORTS:
                mark(f"imported {name}")
        spec.loader.exec_module = exec_module
        return spec
sys.meta_path.insert(0, Hook())
atexit.register(lambda: print("marks " + json.dumps(marks), file=sys.stderr, flush=True))
from edgelm.runtime.cli.launch import command
sys.argv = ["edgelm", "generate", "-m", sys.argv[1], "Hello", "--max-new-tokens", "1"]
command()
"""


def one_run(package: str, environ: dict) -> dict:
    started = time.time()
    process = subprocess.Popen(
        [sys.executable, "-c", CHILD, package], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=environ
    )
    process.stdout.read(1)
    first = time.time()
    _, err = process.communicate()
    ended = time.time()
    if process.returncode:
        sys.exit(err.decode(errors="replace").strip()[-400:])
    line = next(x for x in err.decode().splitlines() if x.startswith("marks "))
    marks = {k: v - started for k, v in json.loads(line.removeprefix("marks ")).items()}
    return {**marks, "first token on stdout": first - started, "exit": ended - started}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package")
    parser.add_argument("--base", type=Path, action="append", default=[], help="another checkout of edgelm")
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    environ = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    scratch = tempfile.TemporaryDirectory()
    runs = {
        checkout.name: {**environ, "PYTHONPATH": base_path(checkout, Path(scratch.name) / str(i))}
        for i, checkout in enumerate(args.base)
    }
    runs["this"] = environ
    found = {name: [] for name in runs}
    for round_ in range(args.rounds + 1):
        for name in runs if round_ % 2 else reversed(list(runs)):
            marks = one_run(args.package, runs[name])
            if round_:
                found[name].append(marks)
    scratch.cleanup()
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"{args.rounds} rounds, medians in ms since the process was started; load average {load} after")
    for name, rounds in found.items():
        keys = sorted({k for r in rounds for k in r}, key=lambda k: statistics.median(r[k] for r in rounds if k in r))
        print(f"\n{name}:")
        for key in keys:
            print(f"  {statistics.median(r[key] for r in rounds if key in r) * 1000:7.1f}  {key}")


if __name__ == "__main__":
    main()
