"""`edgelm bench`: how fast a package runs, and how close decode comes to the memory-bandwidth ceiling.

What a user runs to size a machine: load time, first token, decode speed, memory and the ceiling. The
benchmarks' own harness (sampled settings decoded in lockstep, A/B comparisons) is benchmarks/harness.py, built
on the public helpers here (timed_tokens, prompt_ids, cold_start, ReadProbe, peak_rss_mb).

Decoding one token at batch 1 must read every weight once, so tokens/s cannot beat
bandwidth / weight bytes. The ceiling is measured in this process, in the same rounds as the decode it is
compared with: the time for `threads` threads to read a buffer as large as the package's weights. Every
figure is a median of several runs after a warm-up; ratios are medians of per-round ratios.
"""

import base64
import os
import resource
import subprocess
import sys
import threading
import time

import numpy as np
import onnxruntime as ort

from ..batching.step import id_steps
from ..generation_config import GenerationConfig
from ..model import load

# onnxruntime's worker threads spin for a while after a run; on a 2-core machine a probe started at once
# reads at about half speed (measured: 10-13 GB/s right after a decode, 19-24 GB/s after 0.2 s).
SETTLE_S = 0.3


def _median(values):
    return float(np.median(values))


def timed_tokens(model, prompts, new_tokens, options=None, seed=0, steps: list | None = None):
    """Run generation on token ids (greedy unless options say otherwise); returns (seconds to the first token,
    seconds for the rest). steps: a list to append the seconds between consecutive tokens to (the whole decode
    loop per token: the graph's pass, the pick, the loop's own work)."""
    started = time.perf_counter()
    first = last = None
    for _ in exact_decode(model, prompts, new_tokens, options, seed):
        now = time.perf_counter()
        if first is None:
            first = now
        elif steps is not None:
            steps.append(now - last)
        last = now
    return first - started, time.perf_counter() - first


def exact_decode(model, prompts, new_tokens, options=None, seed=0):
    """A fixed batch's steps (id_steps) for exactly new_tokens tokens per row (greedy unless options say otherwise),
    seeded per row."""
    config = GenerationConfig(
        max_new_tokens=new_tokens, ignore_eos=True, eos_token_id=model.arch.eos_token_id, **(options or {})
    )
    rngs = [np.random.default_rng([seed, row]) for row in range(len(prompts))]
    return id_steps(model.engine, prompts, config, model.pad_id, rngs)


def prompt_ids(model, length, seed=0):
    """`length` random token ids of the model's vocabulary, none of them end-of-text (seeded)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, model.arch.vocab_size, size=length)
    eos = model.arch.eos_token_id
    return [int(i) if i != eos else (int(i) + 1) % model.arch.vocab_size for i in ids]


# A one-node ONNX graph, y[1, n] = a[1, k] @ b[k, n], with b fed at run time: onnxruntime's own streaming
# read of b. Serialized here (156 bytes, made with onnx.helper) because the runtime does not import onnx.
READ_PROBE = base64.b64decode(
    "CAcSBmVkZ2VsbTpiChEKAWEKAWISAXkiBk1hdE11bBIKcmVhZF9wcm9iZVoUCgFhEg8KDQgBEgkKAggBCgMSAWtaFQoBYhIQCg4IARIK"
    "CgMSAWsKAxIBbmIUCgF5Eg8KDQgBEgkKAggBCgMSAW5CBAoAEA0="
)


class ReadProbe:
    """The bandwidth ceiling: seconds for `threads` threads to read n_bytes once, from a buffer larger than any
    cache. The faster of onnxruntime's MatMul streaming a [768, n] matrix and NumPy reductions over the same
    bytes; measured again in every round, next to the decode it is compared with."""

    def __init__(self, n_bytes: int, threads: int):
        width = 768
        self.b = np.ones((width, max(n_bytes // (4 * width), 1)), dtype=np.float32)
        self.a = np.ones((1, width), dtype=np.float32)
        self.scale = n_bytes / self.b.nbytes
        options = ort.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
        self.session = ort.InferenceSession(READ_PROBE, options, providers=["CPUExecutionProvider"])
        self.parts = np.array_split(self.b.reshape(-1), threads)

    def _reduce(self):
        workers = [threading.Thread(target=np.maximum.reduce, args=(p,)) for p in self.parts]
        for w in workers:
            w.start()
        for w in workers:
            w.join()

    def seconds(self, repeats: int = 3) -> float:
        medians = []
        for read in (lambda: self.session.run(None, {"a": self.a, "b": self.b}), self._reduce):
            times = []
            for _ in range(repeats + 1):  # the first is a warm-up
                started = time.perf_counter()
                read()
                times.append(time.perf_counter() - started)
            medians.append(_median(times[1:]))
        return min(medians) * self.scale


def _proc_mb(path: str, field: str) -> float | None:
    """A `field:  N kB` line of one of this process's /proc files, in MB; None where Linux does not report it."""
    try:
        with open(path) as lines:
            for line in lines:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def peak_rss_mb() -> float:
    """This process's peak resident memory. VmHWM, unlike ru_maxrss, is not inherited across fork + exec."""
    peak = _proc_mb("/proc/self/status", "VmHWM")
    return peak if peak is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def huge_page_mb() -> float | None:
    """This process's anonymous memory on transparent huge pages (AnonHugePages), where Linux reports it."""
    return _proc_mb("/proc/self/smaps_rollup", "AnonHugePages")


def cold_start(path, threads) -> float:
    """Seconds from starting a fresh Python process to its first generated token."""
    # run(), not the first piece: a token whose text is not complete yet (a lone byte of a character) yields none
    code = (
        "import edgelm.runtime as e\n"
        f"m = e.load({str(path)!r}, threads={threads})\n"
        "m.batch(['Hello'], max_new_tokens=1, ignore_eos=True).run()\n"
    )
    time.sleep(SETTLE_S)  # this process's onnxruntime threads must not compete with the new one
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
    return time.perf_counter() - started


def run_bench(
    path,
    threads: int | None = None,
    device: str = "auto",
    runs: int = 3,
    new_tokens: int = 128,
    long_context: int = 896,
    speculative: str | None = None,
    draft=None,
) -> dict:
    """Measure one package; returns a dict of figures (also what `edgelm bench --json` prints). speculative: a
    mode of the `speculative` option to time against "off" as well (speculation_figures); draft: its draft model."""
    threads = threads or os.cpu_count()
    started = time.perf_counter()
    model = load(path, device=device, threads=threads, draft=draft)
    result = {
        "package": str(model.package.folder),
        "device": model.device,
        "threads": threads,
        "runs": runs,
        "load_s": time.perf_counter() - started,
    }
    result["huge_pages_mb"] = (
        huge_page_mb()
    )  # this process on 2 MiB pages: the packed weights, when started with them (hugepages.py)
    weights = model.package.weight_bytes
    timed_tokens(model, [prompt_ids(model, 8)], 8)  # warm-up
    for length in (8, 128, 512):
        if length < model.arch.n_positions:
            result[f"ttft_{length}_ms"] = 1000 * _median(
                [timed_tokens(model, [prompt_ids(model, length, r)], 1)[0] for r in range(runs)]
            )
    new_tokens = min(new_tokens, model.arch.n_positions - 8)
    long_context = min(long_context, model.arch.n_positions - new_tokens)
    decode_long = [timed_tokens(model, [prompt_ids(model, long_context, r)], new_tokens)[1] for r in range(runs)]
    result[f"decode_after_{long_context}_tok_s"] = (new_tokens - 1) / _median(decode_long)
    result["peak_rss_mb"] = peak_rss_mb()  # batch 1 work; the read probe's buffer comes after
    # Decode at short context and the read probe in the same rounds: their ratio shares each moment's noise.
    # The probe reads host memory, so it bounds CPU decode only; on CUDA the weights live in the GPU's memory.
    probe, decode, reads = (ReadProbe(weights, threads) if model.device == "cpu" else None), [], []
    for r in range(runs):
        time.sleep(SETTLE_S)
        decode.append((new_tokens - 1) / timed_tokens(model, [prompt_ids(model, 8, r)], new_tokens)[1])
        if probe is not None:
            time.sleep(SETTLE_S)
            reads.append(probe.seconds())
    del probe
    result.update({"decode_tok_s": _median(decode), "weight_bytes": weights})
    if reads:
        result.update(
            {
                "read_gb_s": weights / _median(reads) / 1e9,
                "ceiling_tok_s": 1 / _median(reads),
                "decode_fraction_of_ceiling": _median([rate * seconds for rate, seconds in zip(decode, reads)]),
            }
        )
    # Batches, with batch 1 in the same rounds on the same work, so the scaling ratio is measured side by side.
    batch_tokens, rates = min(64, new_tokens), {1: [], 8: [], 16: []}
    for r in range(runs):
        for batch, rate in rates.items():
            rest = timed_tokens(model, [prompt_ids(model, 8, r * 100 + b) for b in range(batch)], batch_tokens)[1]
            rate.append(batch * (batch_tokens - 1) / rest)
    result.update({"batch_8_tok_s": _median(rates[8]), "batch_16_tok_s": _median(rates[16])})
    result["batch_16_over_batch_1"] = _median([b16 / b1 for b1, b16 in zip(rates[1], rates[16])])
    if speculative is not None:
        result.update(speculation_figures(model, speculative, runs, batch_tokens))
    result.update(
        {
            "cold_start_to_first_token_s": _median([cold_start(path, threads) for _ in range(max(1, runs // 2))]),
            "load_average": os.getloadavg(),
        }
    )
    return result


def speculation_figures(model, mode: str, runs: int, new_tokens: int) -> dict:
    """Greedy decode with speculative=`mode` and with "off", side by side in the same rounds, on a prompt that
    quotes itself (a random span given twice: prompt lookup's best case, a draft model's usual one): the
    tokens/s of each, their ratio, and the drafted and accepted tokens of the last round."""
    span = max(4, min(64, (model.arch.n_positions - new_tokens) // 2 - 1))
    on, off, stats = [], [], {}
    for r in range(runs):
        prompt = prompt_ids(model, span, 1000 + r) * 2
        for speculative, rates in ((mode, on), ("off", off)):
            time.sleep(SETTLE_S)
            started = time.perf_counter()
            completion = model.generate([prompt], max_new_tokens=new_tokens, do_sample=False, ignore_eos=True,
                                        speculative=speculative)[0]  # fmt: skip
            rates.append(completion.completion_tokens / (time.perf_counter() - started))
            stats = completion.speculation or stats
    return {
        "speculative": mode,
        "speculative_tok_s": _median(on),
        "speculative_off_tok_s": _median(off),
        "speculative_speedup": _median([a / b for a, b in zip(on, off)]),
        "speculative_drafted": stats.get("drafted", 0),
        "speculative_accepted": stats.get("accepted", 0),
        "speculative_acceptance_rate": stats.get("acceptance_rate"),
    }


ROWS = [
    ("load_s", "load", "{:.2f} s"),
    ("cold_start_to_first_token_s", "process start to first token", "{:.2f} s"),
    ("ttft_8_ms", "first token, 8-token prompt", "{:.0f} ms"),
    ("ttft_128_ms", "first token, 128-token prompt", "{:.0f} ms"),
    ("ttft_512_ms", "first token, 512-token prompt", "{:.0f} ms"),
    ("decode_tok_s", "decode, batch 1, short context", "{:.1f} tok/s"),
    ("decode_after_*", "decode, batch 1, after a long context", "{:.1f} tok/s"),
    ("batch_8_tok_s", "decode, batch 8 (aggregate)", "{:.1f} tok/s"),
    ("batch_16_tok_s", "decode, batch 16 (aggregate)", "{:.1f} tok/s"),
    ("batch_16_over_batch_1", "batch 16 / batch 1, same rounds", "{:.1f}x"),
    ("peak_rss_mb", "peak RSS (batch 1 work)", "{:.0f} MB"),
    ("huge_pages_mb", "of it on huge pages after load", "{:.0f} MB"),
    ("read_gb_s", "memory read, same threads", "{:.1f} GB/s"),
    ("ceiling_tok_s", "ceiling: weights read once per token", "{:.1f} tok/s"),
    ("decode_fraction_of_ceiling", "decode / ceiling, same rounds", "{:.2f}"),
    ("speculative", "speculative (a prompt quoting itself)", "{}"),
    ("speculative_tok_s", "  greedy decode with it", "{:.1f} tok/s"),
    ("speculative_off_tok_s", "  greedy decode with it off", "{:.1f} tok/s"),
    ("speculative_speedup", "  on / off, same rounds", "{:.2f}x"),
    ("speculative_drafted", "  tokens drafted (last round)", "{}"),
    ("speculative_accepted", "  tokens accepted (last round)", "{}"),
    ("speculative_acceptance_rate", "  acceptance rate", "{:.2f}"),
]


def format_table(result: dict) -> str:
    lines = [
        f"{result['package']}  ({result['device']}, {result['threads']} threads, medians of {result['runs']}, load average {result['load_average'][0]:.2f})"
    ]
    for key, label, fmt in ROWS:
        if key.endswith("*"):
            key = next((k for k in result if k.startswith(key[:-1])), None)
            label = f"decode, batch 1, after {key.split('_')[2]} tokens" if key else label
        if result.get(key) is not None:
            lines.append(f"  {label:<40} {fmt.format(result[key])}")
    return "\n".join(lines)
