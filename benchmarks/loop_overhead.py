"""What the Python around the graph costs per decode step: the loop with every decode pass replaced by a stand-in.

    python benchmarks/loop_overhead.py PKG [--rev REV ...] [--repeats 8] [--tokens 64] [--batches 1 16] [--logits-only]
    python benchmarks/loop_overhead.py PKG --profile [--tokens 64]     # cProfile of one real batch-1 greedy decode

The decode loop of runtime/apps/bench.py (exact_decode: the fixed batch's pick, the sampler, the stop checks, the
in-place cache's inputs) runs as a request runs it, except that each decode pass's graph run returns at once: the
prompt's pass and the first decode pass are real, and what the latter wrote (the logits, and the sampling outputs of
a graph that has them, which a runtime that reads them then reads every step) stays for every later step (with a
random-weight package, rows of noise: a flat distribution, top_p's most expensive). What is timed is therefore the
Python and NumPy of a step alone, as the CPU time of the thread that runs them (time.thread_time: time spent waiting
for a busy core is not counted, though a busy core's caches still slow it), microseconds per step, far less
sensitive to other work than tokens per second. Every setting of harness.SAMPLED at each batch size, --repeats times
each, in a process per runtime; with --rev, REV's runtime/ (from `git archive`, imported as edgelm.runtime in its own
process) runs the same, each --rev (repeatable) and the working tree taking turns in one order, then the other.
Printed: the median over repeats of each runtime's microseconds per step, and the working tree's over the first
--rev's. With --logits-only, a runtime that reads a graph's sampling outputs (before they were dropped) is told the
graph has none, so it samples from the logits: the Python and NumPy of the same work on both sides. The package must
write its cache in place (an edgelm package on CPU) and load in every runtime compared (export it with the oldest
revision's code).
"""

import argparse
import cProfile
import dataclasses
import gc
import io
import json
import pstats
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from sampling_outputs import runtime_at, use_runtime  # noqa: E402 (benchmarks/ is on the path above)


class StandIn:
    """Wraps the C++ session under an engine's runner (onnxruntime's private fast path, runtime/engine/fast_path.py):
    its runs of an OrtValue vector go to the graph until `on`, then return at once, leaving every output as it is.
    Everything in Python up to that call (the feeds, the OrtValues, the vector) still runs."""

    def __init__(self, runner):
        self.on, session = False, getattr(runner, "_sess", None)
        if session is None or not hasattr(session, "run_with_ortvaluevector"):
            raise SystemExit("onnxruntime's private fast path is missing here: nothing to stand in for")
        stand_in = self

        class Session:
            def __getattr__(self, name):
                return getattr(session, name)

            def run_with_ortvaluevector(self, *args):
                if not stand_in.on:
                    session.run_with_ortvaluevector(*args)

        runner._sess = Session()


def measure(tree: str, package: str, tokens: int, batches: list, settings: list, repeats: int, logits_only: bool):
    """In a process of its own: edgelm.runtime from `tree`, then {"batch/key": [microseconds per step, ...]}."""
    use_runtime(tree)
    try:  # runtime/apps/bench.py; before the apps/ folder, runtime/bench.py
        from edgelm.runtime.apps.bench import exact_decode, prompt_ids
    except ModuleNotFoundError:
        from edgelm.runtime.bench import exact_decode, prompt_ids
    from edgelm.runtime.model import load

    model = load(package)
    if logits_only and getattr(model.engine.io, "has_sampling", False):  # a runtime that reads sampling outputs
        model.engine.io = dataclasses.replace(model.engine.io, has_sampling=False)
    if not model.engine.writes_cache_in_place:
        raise SystemExit(f"{package}: its cache is not written in place; the stand-in replaces bound runs only")
    stand_in = StandIn(model.engine.runner)
    micros = {}
    for batch in batches:
        prompts = [prompt_ids(model, 8, seed=row) for row in range(batch)]
        for key, options in settings:
            micros[f"{batch}/{key}"] = []
            for repeat in range(repeats + 1):  # the first is a warm-up
                steps = exact_decode(model, prompts, tokens, options)
                next(steps), next(steps)  # the prompt's pass and the first decode pass, both real
                gc.collect()
                stand_in.on, started = True, time.thread_time()
                for _ in steps:
                    pass
                elapsed, stand_in.on = time.thread_time() - started, False
                if repeat:
                    micros[f"{batch}/{key}"].append(1e6 * elapsed / (tokens - 2))
    return micros


def profile(package: str, tokens: int) -> str:
    """cProfile of one real batch-1 greedy decode (graph included): the top functions by own time, with call counts."""
    from edgelm.runtime.apps.bench import exact_decode, prompt_ids
    from edgelm.runtime.model import load

    model = load(package)
    prompts = [prompt_ids(model, 8)]
    for _ in exact_decode(model, prompts, 8):  # warm-up
        pass
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in exact_decode(model, prompts, tokens):
        pass
    profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(30)
    return out.getvalue()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package")
    parser.add_argument("--rev", action="append", default=[], help="a revision beside the working tree (repeatable)")
    parser.add_argument("--repeats", type=int, default=8, help="decodes per setting and batch (medians printed)")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    parser.add_argument(
        "--logits-only", action="store_true", help="a runtime that reads graph sampling outputs samples from the logits"
    )
    parser.add_argument("--profile", action="store_true", help="cProfile one real batch-1 greedy decode instead")
    parser.add_argument("--measure", nargs=2, help=argparse.SUPPRESS)  # a child's runtime tree and settings
    args = parser.parse_args()
    if args.profile:
        print(profile(args.package, args.tokens))
        return
    if args.measure:
        tree, settings = args.measure
        settings = json.loads(settings)
        result = measure(tree, args.package, args.tokens, args.batches, settings, args.repeats, args.logits_only)
        print(json.dumps(result))
        return

    from harness import SAMPLED

    settings = json.dumps([(key, options) for key, _, options in SAMPLED])
    trees = {rev: str(runtime_at(rev, Path(tempfile.mkdtemp()))) for rev in args.rev} | {"working tree": str(ROOT)}
    micros = {name: {} for name in trees}
    halves = 2 if args.rev else 1
    for r in range(halves):  # with --rev, in one order then the other: half the repeats each time
        for name in list(trees)[:: 1 if r % 2 == 0 else -1]:
            command = [sys.executable, __file__, args.package, "--tokens", str(args.tokens), "--batches"]
            command += [*map(str, args.batches), "--repeats", str(-(-args.repeats // halves))]
            command += ["--measure", trees[name], settings] + ["--logits-only"] * args.logits_only
            result = json.loads(subprocess.run(command, capture_output=True, check=True, text=True).stdout)
            for key, values in result.items():
                micros[name].setdefault(key, []).extend(values)
    print(f"CPU microseconds of Python per decode step (graph runs stood in for), {args.tokens} new tokens, medians")
    names = "".join(f" {name:>14}" for name in trees)
    print(f"{'batch':>5}  {'setting':<50}{names}" + ("  ratio" if args.rev else ""))
    for key in micros["working tree"]:
        batch, setting = key.split("/", 1)
        label = next(text for k, text, _ in SAMPLED if k == setting)
        medians = [float(np.median(micros[name][key])) for name in trees]
        ratio = f"  {medians[-1] / medians[0]:.3f}" if args.rev else ""  # the working tree over the first --rev
        print(f"{batch:>5}  {label:<50}" + "".join(f" {m:14.1f}" for m in medians) + ratio)


if __name__ == "__main__":
    main()
