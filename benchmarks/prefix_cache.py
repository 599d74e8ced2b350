"""A conversation's next turn with and without the prefix cache: time to its first token, and the same logits.

    python benchmarks/prefix_cache.py [--package benchmarks/out/pkg-int8] [--rounds 7]

Without --package, a distilgpt2-shaped int8 package is built once under benchmarks/out (random weights,
tools/distilgpt2_checkpoint.py, then `edgelm export --quantize int8`). Each round draws a history (the
turns so far: 400 tokens in the target row) and the next turn's new tokens (the answer and the user's next
message, 40); the next prompt is the history followed by them. Three ways to its first token, interleaved
within the round, after the same settle:

    cold   cache off: the whole prompt is prefilled
    store  cache on but empty: the whole prompt, plus copying its whole chunks into the cache
    warm   cache on, the history's turn run just before (untimed): its whole 128-token chunks are restored

Medians over rounds; ratios are medians of per-round ratios. The warm run's logits must equal the cold run's,
every bit, every round ("same logits").
"""

import argparse
import subprocess
import sys
import time
from pathlib import Path

import edgelm.runtime as edgelm
import numpy as np
from edgelm.runtime.batching.step import id_steps
from edgelm.runtime.generation_config import GenerationConfig
from harness import SETTLE_S, prompt_ids, timed_tokens

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))  # tools/distilgpt2_checkpoint.py
from distilgpt2_checkpoint import build  # noqa: E402

OUT = Path(__file__).resolve().parent / "out"
HISTORIES = (128, 400, 800)  # the target is 400
NEW_TOKENS = 40  # the answer to the last turn and the next message


def int8_package() -> Path:
    package = OUT / "pkg-int8"
    if not (package / "manifest.json").exists():
        checkpoint = build(OUT / "distilgpt2-random")
        cli = "from edgelm.runtime.cli.main import main; main()"
        export = [sys.executable, "-c", cli, "export", str(checkpoint), "-o", str(package), "--quantize", "int8"]
        subprocess.run(export, check=True)
    return package


def first_token(model, prompt: list) -> tuple[float, np.ndarray]:
    """Seconds to the first token of greedy generation, and the logits it was picked from."""
    config = GenerationConfig(max_new_tokens=1, ignore_eos=True, eos_token_id=model.arch.eos_token_id)
    started = time.perf_counter()
    _, logits = next(id_steps(model.engine, [prompt], config, model.pad_id))
    return time.perf_counter() - started, logits.copy()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--package", help="an int8 package (default: build the distilgpt2-shaped one)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    package = args.package or int8_package()
    cold = edgelm.load(package, device="cpu", threads=args.threads)
    cached = edgelm.load(package, device="cpu", threads=args.threads, prefix_cache_mb=64)
    for model in (cold, cached):
        timed_tokens(model, [prompt_ids(model, 8)], 4)  # warm-up
    print(f"{package}, {args.rounds} rounds, {args.threads} threads; next turn = history + {NEW_TOKENS} new tokens")
    print("| history | prompt | reused | cold ms | store ms | warm ms | store / cold | warm / cold | same logits |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | :---: |")
    for length in HISTORIES:
        times, same, reused = {"cold": [], "store": [], "warm": []}, True, 0
        for r in range(args.rounds):
            history = prompt_ids(cold, length, seed=r)
            prompt = history + prompt_ids(cold, NEW_TOKENS, seed=1000 + r)
            time.sleep(SETTLE_S)
            seconds, logits = first_token(cold, prompt)
            times["cold"].append(seconds)
            cached.engine.prefix_cache.clear()
            time.sleep(SETTLE_S)
            times["store"].append(first_token(cached, prompt)[0])
            cached.engine.prefix_cache.clear()
            first_token(cached, history)  # the turn before: its prompt's whole chunks go into the cache
            before = cached.engine.prefix_cache.reused_tokens
            time.sleep(SETTLE_S)
            seconds, warm_logits = first_token(cached, prompt)
            reused = cached.engine.prefix_cache.reused_tokens - before
            times["warm"].append(seconds)
            same = same and np.array_equal(warm_logits, logits)
        cold_ms, store_ms, warm_ms = (1000 * np.median(times[k]) for k in ("cold", "store", "warm"))
        store_ratio = np.median(np.divide(times["store"], times["cold"]))
        warm_ratio = np.median(np.divide(times["warm"], times["cold"]))
        print(
            f"| {length} | {len(prompt)} | {reused} | {cold_ms:.1f} | {store_ms:.1f} | {warm_ms:.1f} | "
            f"{store_ratio:.2f}x | {warm_ratio:.2f}x | {'yes' if same else 'NO'} |"
        )


if __name__ == "__main__":
    main()
