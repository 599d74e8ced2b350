"""Two packages side by side in one process, interleaved: decode speed on the same work.

    python benchmarks/package_ab.py benchmarks/out/pkg-int8 benchmarks/out/pkg-int8-kv8 [--rounds 5] [--tokens N]

Greedy, or with --sample sampled at temperature 0.8 (the same seeds for both). Batch 1 after an 8-token prompt (128 tokens), batch 1 after a 512-token prompt (128 tokens, and the time to
its first token), batch 16 after 8-token prompts (64 tokens), then process start to first token (fresh
processes); the two packages alternate within every round, and the ratio is the median of the per-round
ratios (B over A). --tokens N caps every decode at N new tokens (for a machine too busy for the full work).
"""

import argparse
import time

import edgelm.runtime as edgelm
import numpy as np
from harness import SETTLE_S, cold_start, prompt_ids, timed_tokens

WORK = (
    ("batch 1, 8-token prompt", 1, 8, 128),
    ("batch 1, 512-token prompt", 1, 512, 128),
    ("batch 16, 8-token prompts", 16, 8, 64),
)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("a")
    parser.add_argument("b")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=None, help="new tokens per decode, at most (default 128 / 64)")
    parser.add_argument("--sample", action="store_true", help="sampled decoding (temperature 0.8), not greedy")
    args = parser.parse_args()
    options = {"do_sample": True, "temperature": 0.8} if args.sample else None
    models = [edgelm.load(p, device="cpu", threads=args.threads) for p in (args.a, args.b)]
    for model in models:
        timed_tokens(model, [prompt_ids(model, 8)], 8)  # warm-up
    for label, batch, length, new in WORK:
        new = min(new, args.tokens or new)
        rates, firsts = [[], []], [[], []]
        for r in range(args.rounds):
            for model, rate, first in zip(models, rates, firsts):
                time.sleep(SETTLE_S)  # the other session's threads stop spinning
                prompts = [prompt_ids(model, length, r * 100 + b) for b in range(batch)]
                seconds_first, seconds_rest = timed_tokens(model, prompts, new, options, seed=r)
                rate.append(batch * (new - 1) / seconds_rest)
                first.append(1000 * seconds_first)
        ratio = np.median(np.array(rates[1]) / np.array(rates[0]))
        print(
            f"{label}: A {np.median(rates[0]):.1f} tok/s, B {np.median(rates[1]):.1f} tok/s, B/A {ratio:.2f}",
            flush=True,
        )
        if length >= 128:
            ratio = np.median(np.array(firsts[1]) / np.array(firsts[0]))
            print(
                f"  first token: A {np.median(firsts[0]):.0f} ms, B {np.median(firsts[1]):.0f} ms, B/A {ratio:.2f}",
                flush=True,
            )
    starts = [[], []]
    for r in range(args.rounds):
        for path, start in zip((args.a, args.b), starts):
            start.append(cold_start(path, args.threads))
    ratio = np.median(np.array(starts[1]) / np.array(starts[0]))
    print(
        f"process start to first token: A {np.median(starts[0]):.2f} s, B {np.median(starts[1]):.2f} s, B/A {ratio:.2f}"
    )


if __name__ == "__main__":
    main()
