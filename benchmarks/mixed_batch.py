"""A running batch's step when only some rows sample: the graph's sampling outputs for those rows, for every row,
or for none.

    python benchmarks/mixed_batch.py PACKAGE [--rows 16] [--sampled 8] [--steps 40]

The scheduler puts the rows that use the graph's sampling outputs first and has the graph make them for those
rows only (runtime/batching/slot_cache.py); before, a batch where any row sampled had them made for every row. This fills a
SlotCache with --rows rows of 32-token prompts and times its step three ways, taking turns (the order turning each
step): temperatures for the first --sampled rows, for all rows, and none (a greedy batch). Medians; a benchmark,
not a test: nothing is asserted.
"""

import argparse
import time

import numpy as np
from edgelm.runtime import load
from edgelm.runtime.batching.slot_cache import SlotCache
from harness import prompt_ids


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package")
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--sampled", type=int, default=8)
    parser.add_argument("--steps", type=int, default=40, help="steps of each kind (the batch grows by one column each)")
    args = parser.parse_args()
    model = load(args.package)
    engine, prompt = model.engine, 32
    if not engine.io.has_sampling or not engine.writes_cache_in_place:
        raise SystemExit("this package's graph has no sampling outputs or no in-place cache: export it again")
    if 3 * args.steps + prompt + 1 > model.arch.n_positions or not 0 < args.sampled <= args.rows:
        raise SystemExit("--steps too many for the model's context, or --sampled not in 1..--rows")
    cache = SlotCache(engine, args.rows, model.arch.n_positions)
    for r in range(args.rows):
        ids = np.array([prompt_ids(model, prompt, r)])
        decoder = engine.decoder(1, prompt)
        decoder.run(ids, np.ones_like(ids), np.arange(prompt)[None])
        cache.join(r, decoder.buffers, prompt)
    kinds = {
        f"outputs for the {args.sampled} sampled rows": [1.0] * args.sampled,
        f"outputs for all {args.rows} rows": [1.0] * args.rows,
        "no outputs (greedy)": None,
    }
    tokens, times = np.zeros(args.rows, dtype=np.int64), {kind: [] for kind in kinds}
    cache.step(tokens, None)  # warm-up
    for i in range(args.steps):
        names = list(kinds)
        for kind in names[i % 3 :] + names[: i % 3]:
            started = time.perf_counter()
            cache.step(tokens, kinds[kind])
            times[kind].append(time.perf_counter() - started)
    for kind, seconds in times.items():
        print(f"{kind:<40} {1000 * np.median(seconds):7.2f} ms a step")


if __name__ == "__main__":
    main()
