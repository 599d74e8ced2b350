"""Process start to first token of `edgelm generate`, the commands taking turns round by round.

    python benchmarks/start_to_first_token.py PKG [--bundle DIR/edgelm/edgelm] [--base CHECKOUT] [--floor]
        [--llama-cpp GGUF] [--rounds 9]

Each command is `edgelm generate -m PKG "Hello" --max-new-tokens 1`, timed from its start to its exit (the first
token is its last act): with the package's files checked against the record of the last full check (the
default), with --verify (every file hashed again), and, given --bundle, the frozen command of `edgelm bundle`.
--base CHECKOUT adds the same two commands run from another checkout of edgelm (another commit: `git worktree
add --detach DIR COMMIT`) with this interpreter and its packages, so that before and after take turns in one run;
each further --base adds its plain command, named by its folder (one commit per lever, side by side).
--floor adds what any program that runs the package with onnxruntime and tokenizers pays: the interpreter alone,
its imports of numpy, onnxruntime and tokenizers, and those imports plus the package's tokenizer built and its
onnxruntime session created (edgelm's session options), nothing of edgelm's.
--llama-cpp GGUF adds llama-cpp-python's start to its first token with this interpreter, taking turns with the
rest: import llama_cpp, Llama(GGUF) with the model's own context length and every core (as `edgelm generate`
takes them), then a one-token greedy completion of "Hello" written to stdout; and its floor, `import llama_cpp`
alone. Give it the GGUF of the package's checkpoint at the matching size (q8_0 for int8, q4_0 for int4, f32).
Printed: the median and the range over the rounds, per command, of the time to its exit, the median time to
its first byte on stdout (the first token; for the floor commands, which print nothing, their exit), and the
median CPU time (user + system) of the process, which a busy machine changes less than the time. The first
round is a warm-up, not counted; it also writes the bytecode caches an installed package has
(PYTHONDONTWRITEBYTECODE is cleared for the commands).
"""

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FLOOR_IMPORTS = "import numpy, onnxruntime, tokenizers"
# edgelm's own session options (runtime/engine/session.py), with nothing of edgelm imported
FLOOR_SESSION = """
import sys, numpy, onnxruntime as ort, tokenizers
tokenizers.Tokenizer.from_file(sys.argv[1] + "/tokenizer.json")
options = ort.SessionOptions()
options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
options.log_severity_level, options.inter_op_num_threads = 4, 1
ort.InferenceSession(sys.argv[1] + "/model.onnx", sess_options=options, providers=["CPUExecutionProvider"])
"""

# llama-cpp-python's start to its first token: what a program that runs the GGUF with it does (no server, no chat)
LLAMA_CPP = """
import os, sys
from llama_cpp import Llama
model = Llama(sys.argv[1], n_ctx=0, n_threads=os.cpu_count(), n_threads_batch=os.cpu_count(), verbose=False)
completion = model.create_completion("Hello", max_tokens=1, temperature=0.0)
sys.stdout.write(completion["choices"][0]["text"] or "?")
sys.stdout.flush()
"""


def base_path(checkout: Path, folder: Path) -> str:
    """A folder for PYTHONPATH whose edgelm.runtime and edgelm.export are `checkout`'s (pyproject's package-dir)."""
    package = folder / "edgelm"
    package.mkdir(parents=True)
    for name in ("runtime", "export"):
        (package / name).symlink_to(checkout.resolve() / name, target_is_directory=True)
    return str(folder)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package")
    parser.add_argument("--bundle", help="the frozen edgelm of a bundle")
    parser.add_argument(
        "--base",
        type=Path,
        action="append",
        default=[],
        help="another checkout of edgelm, run with this interpreter; again for more (their plain command only)",
    )
    parser.add_argument("--floor", action="store_true", help="add the floor commands (see above)")
    parser.add_argument("--llama-cpp", metavar="GGUF", help="add llama-cpp-python's start with this GGUF (see above)")
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    edgelm = shutil.which("edgelm", path=str(Path(sys.executable).parent)) or "edgelm"
    tail = ["generate", "-m", args.package, "Hello", "--max-new-tokens", "1"]
    environ = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    commands = {}  # name -> (command, environment)
    scratch = tempfile.TemporaryDirectory()
    for i, checkout in enumerate(args.base):
        base_env = {**environ, "PYTHONPATH": base_path(checkout, Path(scratch.name) / str(i))}
        if i == 0:
            commands["base: edgelm generate"] = ([edgelm, *tail], base_env)
            commands["base: edgelm generate --verify"] = ([edgelm, *tail, "--verify"], base_env)
        else:
            commands[f"{checkout.name}: edgelm generate"] = ([edgelm, *tail], base_env)
    commands["edgelm generate"] = ([edgelm, *tail], environ)
    commands["edgelm generate --verify"] = ([edgelm, *tail, "--verify"], environ)
    if args.bundle:
        commands["bundle's edgelm generate"] = ([args.bundle, *tail], environ)
    if args.floor:
        commands["floor: python -c pass"] = ([sys.executable, "-c", "pass"], environ)
        commands["floor: + imports"] = ([sys.executable, "-c", FLOOR_IMPORTS], environ)
        commands["floor: + tokenizer, session"] = ([sys.executable, "-c", FLOOR_SESSION, args.package], environ)
    if args.llama_cpp:
        commands["llama-cpp-python, 1 token"] = ([sys.executable, "-c", LLAMA_CPP, args.llama_cpp], environ)
        commands["llama-cpp-python: import"] = ([sys.executable, "-c", "import llama_cpp"], environ)
    times = {name: [] for name in commands}
    cpu = {name: [] for name in commands}
    firsts = {name: [] for name in commands}
    load_before = os.getloadavg()
    for round_ in range(args.rounds + 1):
        for name, (command, env) in commands.items():
            before, started = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
            process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
            process.stdout.read(1)  # blocks until the first token's first byte is written (or the exit)
            first = time.perf_counter() - started
            process.communicate()
            if process.returncode:
                sys.exit(f"{name} failed with exit status {process.returncode}: {' '.join(command)}")
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            if round_:
                times[name].append(time.perf_counter() - started)
                firsts[name].append(first)
                cpu[name].append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    scratch.cleanup()
    loads = " ".join(f"{x:.2f}" for x in load_before), " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"{args.rounds} rounds after a warm-up; load average {loads[0]} before, {loads[1]} after")
    for name, seconds in times.items():
        print(
            f"{name:32} median {statistics.median(seconds):.3f} s  (min {min(seconds):.3f}, max {max(seconds):.3f}); "
            f"first output {statistics.median(firsts[name]):.3f} s; CPU time {statistics.median(cpu[name]):.3f} s"
        )


if __name__ == "__main__":
    main()
