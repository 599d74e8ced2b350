"""How much a row's logits depend on the other rows of a running batch (continuous batching, runtime/batching/slot_cache.py).

    python benchmarks/batch_drift.py PACKAGE [--rows 16] [--steps 32]

Each of `rows` prompts is decoded greedily alone (Model's usual batch-1 path), recording its logits at every
step. Then all rows run together in one SlotCache, prefilled alone and joining two steps apart, each fed its
own alone-greedy tokens (teacher forcing, so every step compares the same context). Prints, over all rows and
steps: the largest |logit difference|, the mean and largest KL(alone || batched), and how often the argmax
agrees. fp32 graphs should show ~0 (masked columns add exactly 0); int8 graphs quantize activations per pass
over every row at once, which this measures. A benchmark, not a test: nothing is asserted.
"""

import argparse

import numpy as np
from edgelm.runtime import load
from edgelm.runtime.batching.slot_cache import SlotCache
from edgelm.runtime.batching.step import id_steps
from edgelm.runtime.sampling import log_softmax

PROMPTS = [
    "Hello, my name is",
    "The quick brown fox",
    "Once upon a time, in a land far away, there lived a keeper of lighthouses who",
    "In the beginning",
    "import numpy as np",
    "The capital of France is",
    "def fibonacci(n):",
    "It was a bright cold day in April, and the clocks were striking thirteen.",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("package")
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--steps", type=int, default=32)
    args = parser.parse_args()
    model = load(args.package)
    engine, config = model.engine, model.settings(do_sample=False, ignore_eos=True, max_new_tokens=args.steps)
    room = model.arch.n_positions - args.steps  # the prompt's last tokens, if the context is short
    prompts = [model.encode(PROMPTS[i % len(PROMPTS)] + " " * (i // len(PROMPTS)))[-room:] for i in range(args.rows)]

    alone = []  # per row: (greedy tokens, logits per step [steps, V])
    for ids in prompts:
        steps = [
            (int(t[0]), logits[0].copy()) for t, logits in id_steps(engine, [ids], config, model.pad_id)
        ]
        alone.append(([t for t, _ in steps], np.stack([logits for _, logits in steps])))

    cache = SlotCache(engine, args.rows, model.arch.n_positions)
    batched = [[] for _ in prompts]  # per row: logits of the steps it has taken in the batch
    fed = [0] * len(prompts)  # tokens each row has been fed
    for step in range(args.steps + 2 * len(prompts)):
        if step % 2 == 0 and step // 2 < len(prompts):  # a row joins every other step
            row = step // 2
            ids = np.asarray([prompts[row]])
            decoder = engine.decoder(1, ids.shape[1])
            decoder.run(ids, np.ones_like(ids), np.arange(ids.shape[1])[None])
            cache.join(row, decoder.buffers, ids.shape[1])
        for slot in reversed(range(len(cache.rows))):  # a row that has taken every step leaves
            if fed[cache.rows[slot]] == args.steps - 1:
                cache.leave(slot)
        if not cache.rows:
            break
        tokens = np.array([alone[row][0][fed[row]] for row in cache.rows], dtype=np.int64)
        logits = cache.step(tokens)
        for slot, row in enumerate(cache.rows):
            fed[row] += 1
            batched[row].append(logits[slot].copy())

    diffs, kls, agree = [], [], []
    for (tokens, reference), got in zip(alone, batched):
        reference, got = reference[1 : 1 + len(got)], np.stack(got)  # step 0 is the prefill, the same path
        diffs.append(np.abs(reference - got).max())
        p, q = log_softmax(reference), log_softmax(got)
        kls.extend((np.exp(p) * (p - q)).sum(axis=-1))
        agree.extend(reference.argmax(-1) == got.argmax(-1))
    print(f"{args.package}: {len(prompts)} rows, {args.steps} steps each, joining two steps apart (teacher-forced)")
    print(f"  max |logit difference|   {max(diffs):.3g}")
    print(f"  KL(alone || batched)     mean {np.mean(kls):.2e}, max {np.max(kls):.2e}")
    print(f"  argmax agreement         {np.mean(agree):.4f} of {len(agree)} steps")


if __name__ == "__main__":
    main()
