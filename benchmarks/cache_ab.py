"""The in-place cache against the growing one, side by side in one process: first token and decode speed.

    python benchmarks/cache_ab.py models/distilgpt2-int8 [--threads 2] [--rounds 3]

Both paths run the same package and prompts, interleaved; medians over rounds, 128 tokens each.
"""

import argparse
import time

import edgelm.runtime as edgelm
import numpy as np
from edgelm.runtime.batching.step import id_steps
from edgelm.runtime.engine.decode import GrowingDecoder
from edgelm.runtime.generation_config import GenerationConfig

NEW_TOKENS = 128


def timed(engine, prompt, eos) -> tuple[float, float]:
    """Milliseconds to the first token (the prompt pass), then tokens per second after it."""
    config = GenerationConfig(max_new_tokens=NEW_TOKENS, ignore_eos=True, eos_token_id=eos)
    started, first = time.perf_counter(), None
    for _ in id_steps(engine, [prompt], config, eos):
        first = first or time.perf_counter()
    return 1000 * (first - started), (NEW_TOKENS - 1) / (time.perf_counter() - first)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("package")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    model = edgelm.load(args.package, device="cpu", threads=args.threads)
    engine, in_place = model.engine, model.engine.decoder
    growing = lambda batch, capacity: GrowingDecoder(engine, batch)  # noqa: E731  (the prompt in one pass)
    eos = model.arch.eos_token_id
    for length in (8, 512):
        prompt = [(i * 7919) % (model.arch.vocab_size - 1) for i in range(length)]
        rates = {"in-place": [], "growing": []}
        for _ in range(args.rounds):
            for name, make_cache in (("in-place", in_place), ("growing", growing)):
                engine.decoder = make_cache
                rates[name].append(timed(engine, prompt, eos))
        engine.decoder = in_place
        print(
            f"{args.threads} threads, {length}-token prompt: "
            + ", ".join(
                f"{k} first token {np.median([r[0] for r in v]):.0f} ms, decode {np.median([r[1] for r in v]):.1f} tok/s"
                for k, v in rates.items()
            )
        )


if __name__ == "__main__":
    main()
