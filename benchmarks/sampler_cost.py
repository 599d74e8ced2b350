"""Where a sampled step's extra time goes: the sampler's CPU time per step inside the real decode loop, and its parts.

    python benchmarks/sampler_cost.py PKG [--rounds 3] [--tokens 64] [--parts]
    python benchmarks/sampler_cost.py PKG --floor     # the exact draw's array operations, warm, one at a time
    python benchmarks/sampler_cost.py PKG --penalty-ids   # the penalties' arithmetic both ways, by seen ids, cold

Batch 1, every setting of harness.SAMPLED, the settings' decodes taking turns round by round (real graph passes, so
the sampler runs as it does in a request: right after a model step has pushed its code and data out of the caches,
which makes every pass over the vocabulary and every NumPy call cost several times what it costs in a loop of its
own). Printed per setting: the median CPU time of the thread in the sampler's call per step (time.thread_time_ns,
which time spent waiting for a busy core does not count), and that minus greedy's: the sampler's extra cost of a
sampled step. With --parts, the sampler's functions named in PARTS are wrapped too, and each one's median CPU time
per step (inclusive: a part that calls another counts it too) is printed under its setting; the wrappers add about
a microsecond per call. With --floor, instead: the wall time of each whole-vocabulary operation an exact draw from
softmax(logits) cannot do without (the peak, exp(logit - peak) in float32, the float64 block sums), each repeated
in a loop of its own (warm caches: the arithmetic alone, the least a sampled step can add to a greedy one's argmax).
With --penalty-ids: the CPU time of the penalties' arithmetic (SamplerChain._penalized, all three penalties) on
Python floats and on NumPy arrays, for rows of n seen ids, each call after a 64 MB pass that pushes the caches'
contents out as a model step's weights do (chain.FEW_IDS is where the first stops being the cheaper).
"""

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from edgelm.runtime.batching import step as stepping  # noqa: E402
from edgelm.runtime.model import load  # noqa: E402
from edgelm.runtime.sampling import chain, draw, nucleus, topk  # noqa: E402
from harness import SAMPLED, prompt_ids, timed_tokens  # noqa: E402

# (module, function name): the sampler's parts a step may call, wrapped with --parts
PARTS = [
    (chain.SamplerChain, "_penalize"),
    (chain, "_put_back"),
    (chain, "pick"),
    (draw, "_draw_dense"),
    (draw, "weights"),
    (draw, "row_weights"),
    (draw, "block_ends"),
    (draw, "draw_rows"),
    (draw, "search"),
    (draw, "among"),
    (nucleus, "draw_from"),
    (nucleus, "verdict"),
    (nucleus, "keeps"),
    (topk, "draw_kept"),
    (topk, "kept"),
]


class Clock:
    """CPU time per step, by name: the step's total for each name, kept when the step ends."""

    def __init__(self):
        self.now: dict[str, int] = {}
        self.steps: dict[str, list] = {}

    def add(self, name: str, ns: int):
        self.now[name] = self.now.get(name, 0) + ns

    def end_step(self, key: str):
        for name, ns in self.now.items():
            self.steps.setdefault((key, name), []).append(ns)
        self.now = {}


def wrap_parts(clock: Clock):
    """Wrap each of PARTS in place so that its CPU time is added to the clock under its name."""
    for owner, name in PARTS:
        function = getattr(owner, name)

        def timed(*args, _function=function, _name=name, **keywords):
            started = time.thread_time_ns()
            try:
                return _function(*args, **keywords)
            finally:
                clock.add(_name, time.thread_time_ns() - started)

        setattr(owner, name, timed)


def timed_chain(clock: Clock, key: str):
    """SamplerChain, with the CPU time of each call added to the clock as the step's total."""

    class Timed(chain.SamplerChain):
        def __call__(self, *args):
            started = time.thread_time_ns()
            try:
                return super().__call__(*args)
            finally:
                clock.add("sampler", time.thread_time_ns() - started)
                clock.end_step(key)

    return Timed


def floor(vocab_size: int, repeats: int = 200):
    """Median wall time (us) of each whole-vocabulary operation of the exact draw (draw.row_weights), warm."""
    row = (np.random.default_rng(0).standard_normal(vocab_size) * 2).astype(np.float32)
    padded = np.zeros(-(-vocab_size // draw.BLOCK) * draw.BLOCK, np.float32)
    w, shifted = padded[:vocab_size], np.empty(vocab_size, np.float32)
    peak = row[row.argmax()]
    np.subtract(row, peak, out=shifted)
    operations = {
        "argmax (greedy's pass too)": lambda: row.argmax(),
        "subtract the peak": lambda: np.subtract(row, peak, out=w),
        "exp, float32": lambda: np.exp(shifted, out=w),
        "float64 block sums": lambda: draw.block_sums(padded[None]),
    }
    print(f"the exact draw's whole-vocabulary operations on [{vocab_size}], warm, median of {repeats} (us)")
    for name, operation in operations.items():
        times = []
        for _ in range(repeats):
            started = time.perf_counter_ns()
            operation()
            times.append(time.perf_counter_ns() - started)
        print(f"  {name:<28} {np.median(times) / 1e3:6.1f}")


def penalty_ids(repeats: int = 60):
    """Median CPU time (us) of SamplerChain._penalized on Python floats and on arrays, by number of seen ids, cold."""
    from edgelm.runtime.generation_config import GenerationConfig

    options = next(options for key, _, options in SAMPLED if key == "penalties")
    sampler = chain.SamplerChain(GenerationConfig(**options), 50_257)
    rng, evict = np.random.default_rng(0), np.ones(16 * 1024 * 1024, np.float32)
    print(f"the penalties' arithmetic, cold, median CPU time of {repeats} calls (us): Python floats | NumPy arrays")
    few = chain.FEW_IDS
    try:
        for n in (64, 140, 300, 600, 1200):
            values = (rng.standard_normal(n) * 3).astype(np.float32)
            offsets = (rng.random(n) * 2).astype(np.float32)
            times = {n_ids: [] for n_ids in (n, -1)}
            for _ in range(repeats):
                for limit in times:  # FEW_IDS at n: Python floats; at -1: arrays
                    chain.FEW_IDS = limit
                    evict.sum()
                    started = time.thread_time_ns()
                    sampler._penalized(values, offsets)
                    times[limit].append(time.thread_time_ns() - started)
            python, arrays = (np.median(t) / 1e3 for t in times.values())
            print(f"  {n:5} ids {python:7.1f} | {arrays:7.1f}")
    finally:
        chain.FEW_IDS = few


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--parts", action="store_true", help="also time the sampler's parts (PARTS)")
    parser.add_argument("--floor", action="store_true", help="only the exact draw's array operations, warm")
    parser.add_argument("--penalty-ids", action="store_true", help="only the penalties' arithmetic both ways, cold")
    args = parser.parse_args()
    if args.penalty_ids:
        penalty_ids()
        return
    model = load(args.package, threads=args.threads)
    if args.floor:
        floor(model.arch.vocab_size)
        return
    clock = Clock()
    if args.parts:
        wrap_parts(clock)
    timed_tokens(model, [prompt_ids(model, 8)], 8)  # warm-up
    for r in range(args.rounds):
        for key, _, options in SAMPLED[r % len(SAMPLED) :] + SAMPLED[: r % len(SAMPLED)]:
            stepping.SamplerChain = timed_chain(clock, key)
            timed_tokens(model, [prompt_ids(model, 8, r)], args.tokens, options, seed=r)
    stepping.SamplerChain = chain.SamplerChain
    print(
        f"batch 1, {args.tokens} new tokens, {args.rounds} rounds: the sampler's CPU time per step in the decode loop, "
        "median (us), and its extra over greedy's"
    )
    greedy = np.median(clock.steps["greedy", "sampler"]) / 1e3
    for key, label, _ in SAMPLED:
        total = np.median(clock.steps[key, "sampler"]) / 1e3
        print(f"  {label:<50} {total:7.1f}   extra {total - greedy:+7.1f}")
        for (k, name), values in clock.steps.items():
            if k == key and name != "sampler":
                print(f"      {name:<20} {np.median(values) / 1e3:7.1f}  ({len(values)} steps)")


if __name__ == "__main__":
    main()
