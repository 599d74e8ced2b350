"""Sampled decode at batch 1 and 16: another revision's runtime against the working tree's, in pairs side by side.

    python benchmarks/sampling_outputs.py PKG [--rev main] [--rounds 5] [--tokens 64] [--batches 1 16]
    python benchmarks/sampling_outputs.py PKG --rev REV --rev-package REV_PKG    # each runtime on its own export
        [--per-process 2] [--settle 0.1] [--seconds S] [--bound 0.02] [--settings greedy openai] [--save PAIRS.json]

What the graph's sampling outputs are worth end to end. Export PKG with a revision whose graph makes them (REV):
REV's runtime draws from them where they serve, the working tree's ignores them (it feeds their temperature zero
rows) and samples from the logits. With --rev-package, REV's runtime decodes REV_PKG, so that each runtime runs the
graph its own export makes (PKG exported by the working tree, without the sampling outputs).

Each runtime runs in a process of its own (REV's is its runtime/ folder from `git archive`, imported as
edgelm.runtime, so nothing is checked out), which loads the package, decodes every setting once untimed, then
decodes on request: the decode loop of runtime/apps/bench.py (exact_decode), exactly --tokens new tokens per row
after an 8-token prompt, seeded per row, timed from the first token on. A round decodes every setting of
harness.SAMPLED at each batch size once in each runtime, the two decodes of a setting one right after the other
(a pair), in ABBA order: REV first in even rounds, the working tree first in odd ones, so that neither always runs
on the caches or the clock the other left. --settle seconds pass before every decode (with onnxruntime's default
spin, a runtime's workers spin on for tens of milliseconds after a run). Both processes start again every
--per-process rounds (a process's memory layout can move its speed: the pairs sample several), in the order that
alternates as well; --seconds starts no round after that many seconds. --settings keeps some of harness.SAMPLED's
settings (more pairs in the same time); --save writes every pair's speeds.

Printed per batch size and setting: each runtime's median decode speed (rows x the tokens after the first, over
their seconds); then twice, for that speed and for the speed at each decode's median step (which a step slowed by
other work does not move), the median of the per-pair ratios working tree / REV, a bootstrap 95% interval of that
median (resampled pairs), and whether the whole interval lies at or above 1 - --bound ("yes"), wholly below it
("no"), or the pairs cannot tell ("?"). An interval is the spread of one run's pairs: what lasts a whole run (the
other cases between the pairs, where the processes landed) can move a ratio by a few percent more, so a reading
holds when a second run agrees. Timing needs quiet cores.
"""

import argparse
import importlib.util
import io
import json
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RESAMPLES = 2000  # bootstrap resamples of the pairs


def runtime_at(rev: str, folder: Path) -> Path:
    """REV's runtime/ folder, unpacked under `folder`; returns the tree that holds it."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "runtime"], capture_output=True, check=True)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(folder, filter="data")
    return folder


def use_runtime(tree: str) -> None:
    """Import `tree`'s runtime/ folder as edgelm.runtime in this process (before any edgelm.runtime import)."""
    import edgelm

    spec = importlib.util.spec_from_file_location(
        "edgelm.runtime", f"{tree}/runtime/__init__.py", submodule_search_locations=[f"{tree}/runtime"]
    )
    runtime = importlib.util.module_from_spec(spec)
    sys.modules["edgelm.runtime"], edgelm.runtime = runtime, runtime
    spec.loader.exec_module(runtime)
    assert Path(runtime.__file__).resolve().is_relative_to(Path(tree).resolve()), runtime.__file__


def serve(tree: str, package: str, tokens: int, batches: list, settings: list, requests, replies) -> None:
    """In a process of its own: edgelm.runtime from `tree`, one untimed decode per batch size and setting, then per
    request line "BATCH KEY" one reply line: that decode's tokens per second, over its steps and at its median step."""
    use_runtime(tree)
    try:  # runtime/apps/bench.py; before the apps/ folder, runtime/bench.py
        from edgelm.runtime.apps.bench import exact_decode, prompt_ids
    except ModuleNotFoundError:
        from edgelm.runtime.bench import exact_decode, prompt_ids
    from edgelm.runtime.model import load

    model = load(package)
    prompts = {batch: [prompt_ids(model, 8, seed=row) for row in range(batch)] for batch in batches}
    options = dict(settings)

    def decode(batch: int, key: str, new_tokens: int) -> list:
        steps = exact_decode(model, prompts[batch], new_tokens, options[key])
        next(steps)  # the prompt's pass and the first token
        seconds, last = [], time.perf_counter()
        for _ in steps:
            now = time.perf_counter()
            seconds.append(now - last)
            last = now
        return [batch * len(seconds) / sum(seconds), batch / float(np.median(seconds))]

    for batch in batches:  # warm-up: every array a decode of this shape makes, every code path it takes
        for key in options:
            decode(batch, key, min(tokens, 8))
    print("ready", file=replies, flush=True)
    for line in requests:
        batch, key = line.split()
        print(json.dumps(decode(int(batch), key, tokens)), file=replies, flush=True)


class Child:
    """One runtime's process (serve): decode(batch, key) -> [tokens per second, at the median step]."""

    def __init__(self, tree: str, package: str, tokens: int, batches: list, settings: list):
        command = [sys.executable, __file__, package, "--tokens", str(tokens), "--batches", *map(str, batches)]
        command += ["--serve", tree, json.dumps(settings)]
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        if self.process.stdout.readline().strip() != "ready":
            raise SystemExit(f"the runtime at {tree} did not start (its error is above)")

    def decode(self, batch: int, key: str) -> list:
        print(batch, key, file=self.process.stdin, flush=True)
        reply = self.process.stdout.readline()
        if not reply:
            raise SystemExit("a runtime's process ended (its error is above)")
        return json.loads(reply)

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait()


def paired_rounds(start, names: tuple, rounds: int, per_process: int, cases: list, settle: float, seconds=None):
    """{case: [(names[0]'s speeds, names[1]'s), one pair per round]} for cases (batch, key). start(name) -> a Child;
    names[0] decodes first in even rounds, second in odd ones (ABBA), and both start again every per_process rounds,
    in the order of the round that starts them."""
    pairs, children, began = {case: [] for case in cases}, {}, time.perf_counter()
    try:
        for r in range(rounds):
            if seconds is not None and r and time.perf_counter() - began > seconds:
                break
            order = names if r % 2 == 0 else names[::-1]
            if r % per_process == 0:
                for child in children.values():
                    child.close()
                children = {}  # closed: none is closed again if a new one fails to start
                children = {name: start(name) for name in order}
            for case in cases:
                speeds = {}
                for name in order:
                    time.sleep(settle)
                    speeds[name] = children[name].decode(*case)
                pairs[case].append((speeds[names[0]], speeds[names[1]]))
    finally:
        for child in children.values():
            child.close()
    return pairs


def median_interval(ratios, level: float = 0.95, resamples: int = RESAMPLES, seed: int = 0) -> tuple:
    """(median, low, high): the median of the ratios and a bootstrap interval of it at `level` (percentiles of the
    medians of `resamples` resamples, with replacement, of as many ratios; seeded, so the same ratios give the same
    interval)."""
    ratios = np.asarray(ratios, dtype=np.float64)
    picks = np.random.default_rng(seed).integers(0, len(ratios), size=(resamples, len(ratios)))
    medians = np.median(ratios[picks], axis=1)
    tail = 100 * (1 - level) / 2
    low, high = np.percentile(medians, [tail, 100 - tail])
    return float(np.median(ratios)), float(low), float(high)


def within(low: float, high: float, bound: float) -> str:
    """"yes" when the interval lies at or above 1 - bound, "no" when wholly below it, else "?"."""
    return "yes" if low >= 1 - bound else "no" if high < 1 - bound else "?"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package")
    parser.add_argument("--rev", default="main")
    parser.add_argument("--rounds", type=int, default=5, help="pairs per batch size and setting")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--rev-package", help="REV's runtime decodes this package (exported by REV) instead of PKG")
    parser.add_argument("--per-process", type=int, default=2, help="rounds before both processes start again")
    parser.add_argument("--settle", type=float, default=0.1, help="seconds of rest before each decode")
    parser.add_argument("--seconds", type=float, help="start no round after this many seconds")
    parser.add_argument("--bound", type=float, default=0.02, help="the slowdown 'within' is read against")
    parser.add_argument("--settings", nargs="+", help="these of harness.SAMPLED's keys only (default: all)")
    parser.add_argument("--save", help="write every pair's speeds here, as JSON")
    parser.add_argument("--serve", nargs=2, help=argparse.SUPPRESS)  # a child's runtime tree and settings
    args = parser.parse_args()
    if args.serve:
        tree, settings = args.serve
        serve(tree, args.package, args.tokens, args.batches, json.loads(settings), sys.stdin, sys.stdout)
        return
    if args.rounds < 1 or args.per_process < 1:
        parser.error("--rounds and --per-process take 1 or more")

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from harness import SAMPLED

    settings = [(key, options) for key, _, options in SAMPLED if args.settings is None or key in args.settings]
    if not settings:
        parser.error(f"--settings takes some of {', '.join(key for key, _, _ in SAMPLED)}")
    names = (args.rev, "working tree")
    trees = {args.rev: str(runtime_at(args.rev, Path(tempfile.mkdtemp()))), "working tree": str(ROOT)}
    packages = {args.rev: args.rev_package or args.package, "working tree": args.package}
    cases = [(batch, key) for batch in args.batches for key, _ in settings]

    def start(name):
        return Child(trees[name], packages[name], args.tokens, args.batches, settings)

    pairs = paired_rounds(start, names, args.rounds, args.per_process, cases, args.settle, args.seconds)
    done = len(pairs[cases[0]])
    if args.save:  # {"BATCH/KEY": [[[REV's speed, at its median step], [the working tree's ...]], a pair each]}
        Path(args.save).write_text(json.dumps({f"{batch}/{key}": pairs[batch, key] for batch, key in cases}))
    print(f"decode tokens per second, {args.tokens} new tokens per row, {done} pairs (ABBA), medians; ratio: the")
    print(f"median of the pairs' working tree / {args.rev}, its bootstrap 95% interval, within {args.bound:.0%}?")
    print("over each decode's steps, then at each decode's median step")
    header = f"{'steps: ratio interval':<21}  {'median step: same':<21}"
    print(f"{'batch':>5}  {'setting':<50} {args.rev:>10} {'working':>10}  {header}")
    for case in cases:
        batch, key = case
        label = next(text for k, text, _ in SAMPLED if k == key)
        speeds = np.array(pairs[case], dtype=np.float64)  # [pairs, 2 runtimes, 2 measures]
        old, new = np.median(speeds[:, :, 0], axis=0)
        line = f"{batch:>5}  {label:<50} {old:10.1f} {new:10.1f}"
        for measure in range(2):
            ratio, low, high = median_interval(speeds[:, 1, measure] / speeds[:, 0, measure])
            line += f"  {ratio:.3f} {low:.3f}-{high:.3f} {within(low, high, args.bound):<3}"
        print(line)


if __name__ == "__main__":
    main()
