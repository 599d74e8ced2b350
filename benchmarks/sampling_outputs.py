"""Sampled decode at batch 1 and 16: another revision's runtime against the working tree's, side by side.

    python benchmarks/sampling_outputs.py PKG [--rev main] [--rounds 5] [--tokens 64] [--batches 1 16]
    python benchmarks/sampling_outputs.py PKG --rev REV --rev-package REV_PKG    # each runtime on its own export

What the graph's sampling outputs are worth end to end. Export PKG with a revision whose graph makes them (REV):
REV's runtime draws from them where they serve, the working tree's ignores them (it feeds their temperature zero
rows) and samples from the logits. With --rev-package, REV's runtime decodes REV_PKG, so that each runtime runs the
graph its own export makes (PKG exported by the working tree, without the sampling outputs). Each round starts one process per runtime, in alternating order, and each
process decodes every setting of harness.SAMPLED at each batch size: the decode loop of runtime/bench.py
(exact_decode), exactly --tokens new tokens per row after an 8-token prompt, seeded per row. REV's runtime is its
runtime/ folder from `git archive`, imported as edgelm.runtime in its own process, so nothing is checked out.
Printed per batch size and setting: the median over rounds of each runtime's decode speed (rows x the tokens after
the first, over their seconds) and the ratio working tree / REV. Timing needs quiet cores.
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


def measure(tree: str, package: str, tokens: int, batches: list, settings: list) -> dict:
    """In a process of its own: edgelm.runtime from `tree`, then {"batch/key": decode tokens per second}."""
    use_runtime(tree)
    try:  # runtime/apps/bench.py; before the apps/ folder, runtime/bench.py
        from edgelm.runtime.apps.bench import exact_decode, prompt_ids
    except ModuleNotFoundError:
        from edgelm.runtime.bench import exact_decode, prompt_ids
    from edgelm.runtime.model import load

    model = load(package)
    for _ in exact_decode(model, [prompt_ids(model, 8)], 4):  # warm-up
        pass
    speeds = {}
    for batch in batches:
        prompts = [prompt_ids(model, 8, seed=row) for row in range(batch)]
        for key, options in settings:
            steps = exact_decode(model, prompts, tokens, options)
            next(steps)  # the prompt's pass and the first token
            started = time.perf_counter()
            for _ in steps:
                pass
            speeds[f"{batch}/{key}"] = batch * (tokens - 1) / (time.perf_counter() - started)
    return speeds


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package")
    parser.add_argument("--rev", default="main")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--rev-package", help="REV's runtime decodes this package (exported by REV) instead of PKG")
    parser.add_argument("--measure", nargs=2, help=argparse.SUPPRESS)  # a child's runtime tree and settings
    args = parser.parse_args()
    if args.measure:
        tree, settings = args.measure
        print(json.dumps(measure(tree, args.package, args.tokens, args.batches, json.loads(settings))))
        return

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from harness import SAMPLED

    settings = json.dumps([(key, options) for key, _, options in SAMPLED])
    trees = {args.rev: str(runtime_at(args.rev, Path(tempfile.mkdtemp()))), "working tree": str(ROOT)}
    packages = {args.rev: args.rev_package or args.package, "working tree": args.package}
    speeds = {name: [] for name in trees}
    for r in range(args.rounds):
        for name in list(trees)[:: 1 if r % 2 == 0 else -1]:  # who goes first alternates
            command = [sys.executable, __file__, packages[name], "--tokens", str(args.tokens), "--batches"]
            command += [*map(str, args.batches), "--measure", trees[name], settings]
            speeds[name].append(json.loads(subprocess.run(command, capture_output=True, check=True, text=True).stdout))
    print(f"decode tokens per second, {args.tokens} new tokens per row, median of {args.rounds} rounds")
    print(f"{'batch':>5}  {'setting':<50} {args.rev:>12} {'working tree':>12}  ratio")
    for key in speeds["working tree"][0]:
        batch, setting = key.split("/", 1)
        label = next(text for k, text, _ in SAMPLED if k == setting)
        old, new = (float(np.median([round_[key] for round_ in speeds[name]])) for name in trees)
        print(f"{batch:>5}  {label:<50} {old:12.1f} {new:12.1f}  {new / old:.3f}")


if __name__ == "__main__":
    main()
