"""The same packages on CUDA and on the CPU: log-probs of one text, greedy tokens, a batch, decode speed.

    python benchmarks/cuda_parity.py PACKAGE [PACKAGE ...]     # needs onnxruntime-gpu and an NVIDIA GPU

Prints one JSON line per package: the device `auto` picks, the largest log-prob difference over a 280-token text,
how many of 4 prompts give the same 32 greedy tokens (and where the first difference is), whether a CUDA batch of
the 4 prompts equals each prompt alone, and median decode tok/s of 128 greedy tokens on each device. A package
that fails reports its error and the next one runs.
"""

import json
import sys
import time

import edgelm.runtime as rt
import numpy as np

PROMPTS = [
    "Hello, my name is",
    "The quick brown fox jumps over",
    "Once upon a time there was a",
    "import numpy as np\n",
]
TEXT = " ".join(["The history of the city begins with a small settlement on the river."] * 20)


def decode_rate(model, runs: int = 3, tokens: int = 128) -> float:
    model.generate(PROMPTS[0], max_new_tokens=8, ignore_eos=True)  # warm-up
    rates = []
    for _ in range(runs):
        started = time.perf_counter()
        model.generate(PROMPTS[0], max_new_tokens=tokens, ignore_eos=True)
        rates.append(tokens / (time.perf_counter() - started))
    return round(float(np.median(rates)), 1)


def compare(path: str) -> dict:
    cpu, cuda = rt.load(path, device="cpu"), rt.load(path, device="cuda")
    r = {"auto_device": rt.load(path).device}
    a, b = np.array(cpu.score(TEXT).logprobs[1:]), np.array(cuda.score(TEXT).logprobs[1:])
    r["logprob_max_abs_diff"], r["scored_tokens"] = float(np.max(np.abs(a - b))), len(a)
    firsts = []
    for prompt in PROMPTS:
        x = cpu.generate(prompt, max_new_tokens=32, ignore_eos=True).token_ids
        y = cuda.generate(prompt, max_new_tokens=32, ignore_eos=True).token_ids
        firsts.append(next((i for i, (u, v) in enumerate(zip(x, y)) if u != v), None))
    r["greedy_first_difference"] = firsts
    r["greedy_identical"] = f"{firsts.count(None)}/{len(PROMPTS)}"
    alone = [cuda.generate(p, max_new_tokens=24, ignore_eos=True).token_ids for p in PROMPTS]
    together = [c.token_ids for c in cuda.batch(PROMPTS, max_new_tokens=24, ignore_eos=True).run()]
    r["cuda_batch_equals_alone"] = [u == v for u, v in zip(alone, together)]
    r["cpu_tok_s"], r["cuda_tok_s"] = decode_rate(cpu), decode_rate(cuda)
    return r


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        sys.exit(f"usage: {sys.argv[0]} PACKAGE [PACKAGE ...]")
    for path in sys.argv[1:]:
        try:
            result = compare(path)
        except Exception as error:  # report it and go on to the next package
            result = {"error": f"{type(error).__name__}: {error}"}
        print(json.dumps({path: result}), flush=True)
