"""How long prompts go into the in-place cache: first token, peak memory and int8 fidelity per chunk size.

    python benchmarks/prefill_chunks.py benchmarks/out/pkg-int8 [--fp32 benchmarks/out/pkg-none] [--rounds 7]
    python benchmarks/prefill_chunks.py benchmarks/out/pkg-int8 --ops    # where the prompt's kernel time goes

First token after a 512-token prompt for chunks of 64, 128, 256 and one pass, interleaved in one process
(medians); onnxruntime's own kernel time for that prompt (its profiler, steadier than the wall clock on a
shared machine); peak RSS of a fresh process per chunk size (load, the prompt, 128 tokens); with --fp32, the
int8 package's last-position KL divergence to the fp32 package, one pass against chunks of 128.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import edgelm.runtime as edgelm
import numpy as np
from edgelm.runtime.engine import decode as engine
from edgelm.runtime.sampling import log_softmax
from harness import peak_rss_mb, prompt_ids, timed_tokens

CHUNKS = (64, 128, 256, 512)
PROMPT = 512


def peak_in_fresh_process(package: str, chunk: int) -> float:
    code = (
        "import json, edgelm.runtime as e\n"
        "from edgelm.runtime import engine\n"
        "from edgelm.runtime.apps.bench import peak_rss_mb, prompt_ids, timed_tokens\n"
        f"engine.PREFILL_CHUNK = {chunk}\n"
        f"m = e.load({package!r})\n"
        f"timed_tokens(m, [prompt_ids(m, {PROMPT})], 128)\n"
        "print(json.dumps(peak_rss_mb()))\n"
    )
    return json.loads(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout)


def kernel_ms(model, chunk: int, repeats: int = 4) -> float:
    """Sum of onnxruntime's per-node kernel times for one chunked prompt, from a profiling session."""
    return sum(kernel_ms_by_op(model, chunk, repeats).values())


def kernel_ms_by_op(model, chunk: int, repeats: int = 4) -> dict:
    """onnxruntime's per-node kernel times for one chunked prompt, summed per operator type, from its profiler."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.enable_profiling, options.log_severity_level = True, 3
    options.profile_file_prefix = os.path.join(tempfile.mkdtemp(), "prefill")
    session = ort.InferenceSession(str(model.package.model_file), options, providers=["CPUExecutionProvider"])
    profiled = engine.Engine(
        session,
        model.engine.io,
        model.arch.kv_heads,
        model.arch.head_size,
        model.arch.vocab_size,
        "cpu",
        model.engine.embeddings,
    )
    engine.PREFILL_CHUNK = chunk
    ids = np.array([prompt_ids(model, PROMPT)])
    for _ in range(repeats):
        profiled.decoder(1, PROMPT + 1).run(ids, np.ones_like(ids), np.arange(PROMPT)[None])
    events = json.loads(open(session.end_profiling()).read())
    by_op = {}
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            by_op[e["args"]["op_name"]] = by_op.get(e["args"]["op_name"], 0.0) + e["dur"] / 1000 / repeats
    return by_op


def last_logprobs(model, ids, chunk) -> np.ndarray:
    engine.PREFILL_CHUNK = chunk
    row = np.array([ids])
    logits = model.engine.decoder(1, len(ids) + 1).run(row, np.ones_like(row), np.arange(len(ids))[None])
    return log_softmax(logits[:, -1])[0]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("package")
    parser.add_argument("--fp32", help="the same checkpoint exported without quantization, as the reference")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--ops", action="store_true", help="instead: the runtime's chunks' kernel time per op type")
    args = parser.parse_args()
    model = edgelm.load(args.package)
    if args.ops:
        by_op = kernel_ms_by_op(model, engine.PREFILL_CHUNK)
        total = sum(by_op.values())
        print(f"a {PROMPT}-token prompt in chunks of {engine.PREFILL_CHUNK}: kernel time {total:.0f} ms")
        for op, ms in sorted(by_op.items(), key=lambda kv: -kv[1])[:8]:
            print(f"  {op:<32} {ms:7.1f} ms  {100 * ms / total:5.1f}%")
        return
    timed_tokens(model, [prompt_ids(model, PROMPT)], 1)  # warm-up
    first = {chunk: [] for chunk in CHUNKS}
    for r in range(args.rounds):
        for chunk in CHUNKS:
            engine.PREFILL_CHUNK = chunk
            first[chunk].append(1000 * timed_tokens(model, [prompt_ids(model, PROMPT, r)], 1)[0])
    for chunk in CHUNKS:
        label = "one pass" if chunk >= PROMPT else f"chunks of {chunk}"
        print(
            f"{label:>14}: first token after {PROMPT} tokens {np.median(first[chunk]):.0f} ms, "
            f"kernel time {kernel_ms(model, chunk):.0f} ms, peak RSS {peak_in_fresh_process(args.package, chunk):.0f} MB"
        )
    if args.fp32:
        reference = edgelm.load(args.fp32)
        rng = np.random.default_rng(0)
        prompts = [rng.integers(0, model.arch.vocab_size - 1, PROMPT).tolist() for _ in range(5)]
        for label, chunk in (("one pass", PROMPT), ("chunks of 128", 128)):
            kl = []
            for ids in prompts:
                ref, ours = last_logprobs(reference, ids, PROMPT), last_logprobs(model, ids, chunk)
                kl.append(float(np.sum(np.exp(ref) * (ref - ours))))
            print(f"int8 {label}: KL to fp32 at the last position, mean of {len(prompts)} prompts {np.mean(kl):.5f}")
    print(f"(this process's peak RSS {peak_rss_mb():.0f} MB)")


if __name__ == "__main__":
    main()
