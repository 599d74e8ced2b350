"""The sampler of another git revision against the working tree's, side by side in one process.

    python benchmarks/sampling_ab.py PACKAGE [--rev main] [--runs 5] [--tokens 128]

Two measurements, each interleaved so both samplers share every moment's noise:
1. one sampler-chain call on a [1, V] row (V from the package), per setting of benchmarks/harness.py (SAMPLED), on a
   nearly flat row (random-weight checkpoints give those: the nucleus is most of the vocabulary) and a peaked
   one; medians of CPU time per call;
2. decode tok/s at batch 1 through the engine with each sampler, per setting, and the ratio to greedy;
3. with --alternate-steps, instead of 2: the two samplers take turns step by step inside the same decodes, so each
   step's CPU time is compared with its neighbour's (finer than whole decodes when other work loads the machine).
The other revision's runtime/sampling/ is loaded from `git archive` as a package of its own beside edgelm.runtime,
whose other modules it shares, so nothing is checked out.
"""

import argparse
import importlib.util
import io
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np
from edgelm.runtime import sampling as current
from edgelm.runtime.batching import step as stepping
from edgelm.runtime.generation_config import GenerationConfig
from edgelm.runtime.model import load
from harness import SAMPLED, prompt_ids, timed_tokens

ROOT = Path(__file__).resolve().parents[1]


def sampling_at(rev: str):
    """runtime/sampling/ as it is at `rev` (the sampler chain and the modules it imports), with the package format
    it reads, imported beside edgelm.runtime, whose other modules it shares."""
    import edgelm.runtime as runtime

    package = f"edgelm.runtime._at_{rev.replace('/', '_').replace('~', '_').replace('^', '_')}"
    folder = Path(tempfile.mkdtemp())
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", rev, "runtime/sampling", "runtime/package"], capture_output=True, check=True
    )
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(folder, filter="data")
    spec = importlib.util.spec_from_loader(package, loader=None, is_package=True)
    module = importlib.util.module_from_spec(spec)
    module.__path__ = [str(folder / "runtime")]
    sys.modules[package] = module
    # what the sampler imports from outside its folder: the installed runtime's modules
    for name in ("errors", "generation_config", "constraint_bounds", "constraint_text"):
        sys.modules[f"{package}.{name}"] = importlib.import_module(f"{runtime.__name__}.{name}")
    return importlib.import_module(f"{package}.sampling")


def chain_seconds(module, options, logits, seen, generated, repeats):
    # one request's chain, called as the decode loop calls it: the histories grow by one token per step
    chain = module.SamplerChain(GenerationConfig(**options), logits.shape[-1])
    seen, generated = [list(ids) for ids in seen], [list(ids) for ids in generated]
    chain(logits, seen, generated, [np.random.default_rng(0)])  # the first step reads the whole prompt
    times = []
    for r in range(repeats):
        rngs = [np.random.default_rng(r)]
        started = time.thread_time()
        token = chain(logits, seen, generated, rngs)[0]
        times.append(time.thread_time() - started)
        seen[0].append(int(token))
        generated[0].append(int(token))
    return times


def timed_chain(module, steps: list):
    """module.SamplerChain, with the CPU time of each call appended to `steps` (the decode loop stays as it is)."""

    class Timed(module.SamplerChain):
        def __call__(self, *args):
            started = time.thread_time_ns()
            try:
                return super().__call__(*args)
            finally:
                steps.append(time.thread_time_ns() - started)

    return Timed


def alternate_steps(model, samplers: dict, args):
    """Measurement 3: one decode per setting and round, its steps sampled by each sampler in turn."""
    print(
        f"\ndecode at batch 1, {args.tokens} new tokens, {args.runs} rounds, the samplers taking turns step by step: "
        "the sampler's median CPU time per step inside the decode loop (ms)"
    )
    names, steps = list(samplers), {}

    def taking_turns(key: str, first: int):
        class Turns:
            def __init__(self, config, vocab_size, *more):  # more: what the step passes on (second_thread)
                self.chains = [module.SamplerChain(config, vocab_size, *more) for module in samplers.values()]
                self.turn = first

            def __call__(self, *args):
                chain, self.turn = self.chains[self.turn % 2], self.turn + 1
                started = time.thread_time_ns()
                try:
                    return chain(*args)
                finally:
                    steps.setdefault((names[(self.turn - 1) % 2], key), []).append(time.thread_time_ns() - started)

            def __getattr__(self, name):  # what the step reads of its sampler (do_sample, constrain)
                return getattr(self.chains[0], name)

        return Turns

    timed_tokens(model, [prompt_ids(model, 8)], 8)  # warm-up
    for r in range(args.runs):
        for key, _, options in SAMPLED[r % len(SAMPLED) :] + SAMPLED[: r % len(SAMPLED)]:
            stepping.SamplerChain = taking_turns(key, r)  # which one goes first turns each round
            timed_tokens(model, [prompt_ids(model, 8, r)], args.tokens, options, seed=r)
    stepping.SamplerChain = current.SamplerChain
    for key, label, _ in SAMPLED:
        old, new = (np.median(steps[name, key]) / 1e6 for name in names)
        print(f"  {label:<50} {names[0]}: {old:6.3f} ms   working tree: {new:6.3f} ms   ({new - old:+.3f})")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package")
    parser.add_argument("--rev", default="main")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--calls-only", action="store_true", help="only measurement 1, the sampler calls alone")
    parser.add_argument(
        "--alternate-steps", action="store_true", help="measurement 3 instead of 2: the samplers take turns each step"
    )
    args = parser.parse_args()
    before = sampling_at(args.rev)
    samplers = {args.rev: before, "working tree": current}
    model = load(args.package)
    vocab = model.arch.vocab_size

    print(f"one chain call on [1, {vocab}], median CPU time per call (ms), {args.rev} | working tree")
    rng = np.random.default_rng(0)
    for scale in (0.05, 3.0):
        logits = (rng.standard_normal((1, vocab)) * scale).astype(np.float32)
        seen = [list(rng.integers(0, vocab, 136))]
        generated = [seen[0][8:]]
        for _, label, options in SAMPLED:
            times = {name: [] for name in samplers}
            for _ in range(10):  # interleaved in short bursts
                for name, module in samplers.items():
                    times[name] += chain_seconds(module, options, logits, seen, generated, 5)
            old, new = (1000 * np.median(times[name]) for name in samplers)
            print(f"  logits x{scale:<4} {label:<50} {old:7.3f} | {new:7.3f}  ({old / new:4.1f}x)")

    if args.calls_only:
        return
    if args.alternate_steps:
        alternate_steps(model, samplers, args)
        return
    print(
        f"\ndecode at batch 1, {args.tokens} new tokens, medians of {args.runs} rounds: tok/s, ratio to greedy, and "
        "the sampler's median CPU time per step inside the decode loop (ms)"
    )
    rates = {(name, key): [] for name in samplers for key, _, _ in SAMPLED}
    steps = {(name, key): [] for name in samplers for key, _, _ in SAMPLED}
    timed_tokens(model, [prompt_ids(model, 8)], 8)  # warm-up
    for r in range(args.runs):
        for key, _, options in SAMPLED[r % len(SAMPLED) :] + SAMPLED[: r % len(SAMPLED)]:
            for name, module in samplers.items():
                stepping.SamplerChain = timed_chain(module, steps[name, key])
                rest = timed_tokens(model, [prompt_ids(model, 8, r)], args.tokens, options, seed=r)[1]
                rates[name, key].append((args.tokens - 1) / rest)
    stepping.SamplerChain = current.SamplerChain
    for key, label, _ in SAMPLED:
        cells = []
        for name in samplers:
            ratio = np.median([s / g for s, g in zip(rates[name, key], rates[name, "greedy"])])
            step_ms = np.median(steps[name, key]) / 1e6
            cells.append(f"{np.median(rates[name, key]):6.1f} tok/s {ratio:4.2f}x {step_ms:6.3f} ms")
        print(f"  {label:<50} {args.rev}: {cells[0]}   working tree: {cells[1]}")


if __name__ == "__main__":
    main()
