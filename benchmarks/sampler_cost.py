"""Where a sampled step's extra time goes: the sampler's CPU time per step inside the real decode loop, and its parts.

    python benchmarks/sampler_cost.py PKG [--rounds 3] [--tokens 64] [--parts]

Batch 1, every setting of harness.SAMPLED, the settings' decodes taking turns round by round (real graph passes, so
the sampler runs as it does in a request: right after a model step has pushed its code and data out of the caches,
which makes every pass over the vocabulary and every NumPy call cost several times what it costs in a loop of its
own). Printed per setting: the median CPU time of the thread in the sampler's call per step (time.thread_time_ns,
which time spent waiting for a busy core does not count), and that minus greedy's: the sampler's extra cost of a
sampled step. With --parts, the sampler's functions named in PARTS are wrapped too, and each one's median CPU time
per step (inclusive: a part that calls another counts it too) is printed under its setting; the wrappers add about
a microsecond per call.
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


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--parts", action="store_true", help="also time the sampler's parts (PARTS)")
    args = parser.parse_args()
    model = load(args.package, threads=args.threads)
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
