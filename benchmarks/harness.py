"""The benchmarks' harness: what the scripts here share, beyond the `edgelm bench` a user runs.

    python benchmarks/harness.py PKG [--runs 3] [--threads N] [--tokens 128] [--json]

run as a script: decode speed at batch 1 under SAMPLED's settings against greedy, the settings' decodes taking
turns step by step (lockstep_steps). The scripts import their helpers from here: timed_tokens, prompt_ids,
cold_start, ReadProbe, peak_rss_mb and SETTLE_S are edgelm.runtime.apps.bench's (which `edgelm bench` measures with),
the rest is this module's own.
"""

import argparse
import json
import os
import time

import numpy as np
from edgelm.runtime.apps.bench import (  # noqa: F401  (the scripts' helpers, re-exported)
    SETTLE_S,
    ReadProbe,
    cold_start,
    exact_decode,
    peak_rss_mb,
    prompt_ids,
    timed_tokens,
)
from edgelm.runtime.model import load


def median(values) -> float:
    return float(np.median(values))


def lockstep_steps(model, prompt, new_tokens, settings: list, seed=0) -> dict:
    """One decode of `prompt` per setting (key, options), the decodes taking turns step by step, in a new random
    order each turn (seeded): {key: seconds of each step after the first token} (the graph's pass, the pick, the
    loop's own work). Every setting's steps share each moment's load, which whole decodes run one after another do
    not, and each follows every other setting about as often, so what a step leaves behind (caches, onnxruntime's
    threads spinning or asleep) falls on all of them alike."""
    decodes = {}
    for key, options in settings:
        decodes[key] = exact_decode(model, [prompt], new_tokens, options, seed)
        next(decodes[key])  # the prompt's pass and the first token
    keys, steps = list(decodes), {key: [] for key in decodes}
    for i in range(new_tokens - 1):
        for k in np.random.default_rng([seed, i]).permutation(len(keys)).tolist():
            key = keys[k]
            started = time.perf_counter()
            next(decodes[key])
            steps[key].append(time.perf_counter() - started)
    return steps


# The sampled settings requests use most, each measured against greedy decoding.
SAMPLED = [
    ("greedy", "greedy", {}),
    ("openai", "temperature 1, top_p 1 (OpenAI's defaults)", {"do_sample": True, "top_k": 0}),
    ("top_p_0.9", "top_p 0.9", {"do_sample": True, "top_k": 0, "top_p": 0.9}),
    ("top_k_50", "top_k 50, temperature 1 (transformers' defaults)", {"do_sample": True, "top_k": 50}),
    (
        "penalties",
        "repetition 1.1, presence 0.5, frequency 0.5",
        {"do_sample": True, "top_k": 0, "repetition_penalty": 1.1, "presence_penalty": 0.5, "frequency_penalty": 0.5},
    ),
]


def run_sample_bench(path, threads: int | None = None, device: str = "auto", runs: int = 3, new_tokens: int = 128):
    """Decode speed at batch 1 with each of SAMPLED's settings: in each round one decode per setting, the decodes
    taking turns step by step in random orders (lockstep_steps), so a moment's load slows every setting alike;
    ratios to greedy are medians of per-round ratios. Two measures of the same decodes: tokens per second over
    the sum of the steps, and one over the median step (which a few steps slowed by other work do not move)."""
    threads = threads or os.cpu_count()
    model = load(path, device=device, threads=threads)
    new_tokens = min(new_tokens, model.arch.n_positions - 8)
    timed_tokens(model, [prompt_ids(model, 8)], 8)  # warm-up
    rates, step_rates = {key: [] for key, _, _ in SAMPLED}, {key: [] for key, _, _ in SAMPLED}
    for r in range(runs):
        settings = [(key, options) for key, _, options in SAMPLED]
        for key, steps in lockstep_steps(model, prompt_ids(model, 8, r), new_tokens, settings, seed=r).items():
            rates[key].append(len(steps) / sum(steps))
            step_rates[key].append(1 / median(steps))
    result = {"package": str(model.package.folder), "device": model.device, "threads": threads, "runs": runs}
    result["new_tokens"] = new_tokens
    for key, _, _ in SAMPLED:
        result[f"{key}_tok_s"] = median(rates[key])
        result[f"{key}_over_greedy"] = median([s / g for s, g in zip(rates[key], rates["greedy"])])
        result[f"{key}_median_step_tok_s"] = median(step_rates[key])
        result[f"{key}_median_step_over_greedy"] = median(
            [s / g for s, g in zip(step_rates[key], step_rates["greedy"])]
        )
    result["load_average"] = os.getloadavg()
    return result


def format_sample_table(result: dict) -> str:
    lines = [
        f"{result['package']}  ({result['device']}, {result['threads']} threads, {result['new_tokens']} new tokens, "
        f"medians of {result['runs']}, load average {result['load_average'][0]:.2f})",
        f"  {'':<58} {'all steps':>26}   {'median step':>26}",
    ]
    for key, label, _ in SAMPLED:
        rate, ratio = result[f"{key}_tok_s"], result[f"{key}_over_greedy"]
        step_rate, step_ratio = result[f"{key}_median_step_tok_s"], result[f"{key}_median_step_over_greedy"]
        lines.append(
            f"  decode, {label:<50} {rate:7.1f} tok/s  {ratio:5.2f}x greedy   {step_rate:7.1f} tok/s  {step_ratio:5.2f}x greedy"
        )
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package")
    parser.add_argument("--runs", type=int, default=3, help="rounds (medians are reported)")
    parser.add_argument("--threads", type=int, default=None, help="onnxruntime intra-op threads (default: all cores)")
    parser.add_argument("--tokens", type=int, default=128, help="new tokens per decode")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    result = run_sample_bench(args.package, threads=args.threads, runs=args.runs, new_tokens=args.tokens)
    print(json.dumps(result, indent=2) if args.json else format_sample_table(result))


if __name__ == "__main__":
    main()
