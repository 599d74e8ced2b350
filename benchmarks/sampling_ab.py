"""The sampler of another git revision against the working tree's, side by side in one process.

    python benchmarks/sampling_ab.py PACKAGE [--rev main] [--runs 5] [--tokens 128]

Two measurements, each interleaved so both samplers share every moment's noise:
1. one sampler-chain call on a [1, V] row (V from the package), per setting of `edgelm bench --sample`, on a
   nearly flat row (random-weight checkpoints give those: the nucleus is most of the vocabulary) and a peaked
   one; medians of CPU time per call;
2. decode tok/s at batch 1 through the engine with each sampler, per setting, and the ratio to greedy.
The other revision's runtime/sampling.py (and the modules it imports from the runtime, if they differ) are
loaded from `git show`, so nothing is checked out.
"""

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from edgelm.runtime import engine
from edgelm.runtime import sampling as current
from edgelm.runtime.bench import SAMPLED, _prompt, _timed_tokens
from edgelm.runtime.generation_config import GenerationConfig
from edgelm.runtime.model import load

ROOT = Path(__file__).resolve().parents[1]


def sampling_at(rev: str):
    """runtime/sampling.py as it is at `rev`, imported as a module of the installed edgelm.runtime package."""
    source = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{rev}:runtime/sampling.py"], check=True, capture_output=True, text=True
    ).stdout
    path = Path(tempfile.mkdtemp()) / "sampling.py"
    path.write_text(source)
    name = f"edgelm.runtime._sampling_{rev.replace('/', '_')}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def chain_seconds(module, options, logits, seen, generated, repeats):
    chain = module.SamplerChain(GenerationConfig(**options), logits.shape[-1])
    times = []
    for r in range(repeats):
        rngs = [np.random.default_rng(r)]
        started = time.thread_time()
        chain(logits, seen, generated, rngs)
        times.append(time.thread_time() - started)
    return times


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package")
    parser.add_argument("--rev", default="main")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=128)
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

    print(f"\ndecode tok/s at batch 1, {args.tokens} new tokens, medians of {args.runs} rounds")
    rates = {(name, key): [] for name in samplers for key, _, _ in SAMPLED}
    _timed_tokens(model, [_prompt(model, 8)], 8)  # warm-up
    for r in range(args.runs):
        for key, _, options in SAMPLED[r % len(SAMPLED) :] + SAMPLED[: r % len(SAMPLED)]:
            for name, module in samplers.items():
                engine.SamplerChain = module.SamplerChain
                rest = _timed_tokens(model, [_prompt(model, 8, r)], args.tokens, options, seed=r)[1]
                rates[name, key].append((args.tokens - 1) / rest)
    engine.SamplerChain = current.SamplerChain
    for key, label, _ in SAMPLED:
        cells = []
        for name in samplers:
            ratio = np.median([s / g for s, g in zip(rates[name, key], rates[name, "greedy"])])
            cells.append(f"{np.median(rates[name, key]):6.1f} tok/s {ratio:4.2f}x")
        print(f"  {label:<50} {args.rev}: {cells[0]}   working tree: {cells[1]}")


if __name__ == "__main__":
    main()
