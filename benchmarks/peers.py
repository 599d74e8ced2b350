"""Side-by-side peer benchmark: the same checkpoint, prompts and threads through every system, interleaved.

    pip install -e '.[export,bench]'
    python benchmarks/peers.py                      # distilgpt2-shaped random checkpoint from ../shared
    python benchmarks/peers.py --checkpoint DIR --rounds 5 --systems edgelm-int8,llama.cpp-q8_0
    python benchmarks/peers.py --shape smollm2-135m --systems llama.cpp-f32,llama.cpp-q8_0,llama.cpp-q4_0

--shape NAME builds a random checkpoint of benchmarks/configs/NAME.json (SmolLM2-135M, Qwen2.5-0.5B) with
GPT-2's tokenizer (benchmarks/random_checkpoint.py says what that changes). Each checkpoint's converted models
are kept under benchmarks/out/peers/CHECKPOINT_FOLDER_NAME/.

Each measurement runs in its own worker process (so peak RSS is that system's alone); rounds go through every
system in turn, so machine noise spreads over all of them. Figures are medians over rounds: decode tok/s (batch 1,
8-token prompt, --new-tokens greedy tokens, 128 unless told), the worker's CPU time per token over that run (all
its threads: with --threads 1 the work a token costs, the figure other processes on the machine move least; with
more threads it counts their spinning too), first token after a 512-token prompt, decode tok/s after that prompt
(as many tokens), and peak RSS of the worker. For edgelm and llama.cpp, also decode tok/s with each sampled setting
of benchmarks/harness.py (harness.SAMPLED: OpenAI's defaults, top_p 0.9, transformers' top_k 50, penalties),
through each system's own sampler chain, and its ratio to the same worker's greedy rate. llama.cpp takes the
settings as llama-cpp-python's generate() names them, with min_p (default 0.05 there) off; its penalties look back
over the last 64 tokens (last_n_tokens_size), edgelm's repetition penalty over the whole context.
genai-fp32/int8/int4 is onnxruntime-genai (peer_prepare.py says which graph it runs). Not part of CI.

Each decode figure counts the tokens the system gave as it gave them, and asks for no more than it times.
Every round prints its load (peer_load.py): the 1-minute load average and the CPU time other processes used
during it, flagged CONTENDED above 10% of the round's capacity; the medians are over the uncontended rounds
when there are at least three of them, and the summary says which.
"""

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
NEW_TOKENS = 128  # the default of --new-tokens
SYSTEMS = [
    "transformers-fp32",
    "optimum-fp32",
    "genai-fp32",
    "genai-int8",
    "genai-int4",  # a Llama-family checkpoint only: genai's model builder makes it
    "ct2-float32",
    "ct2-int8",
    "llama.cpp-f32",
    "llama.cpp-q8_0",
    "llama.cpp-q4_0",
    "llama.cpp-q8_0-nofa",
    "edgelm-fp32",
    "edgelm-int8",
    "edgelm-int8-dynamic",
    "edgelm-int4",
    "edgelm-int8-kv8",
    "edgelm-int4-kv8",
]


def peak_rss_mb() -> float:
    """VmHWM: this worker's own peak (ru_maxrss would carry the driver's over fork + exec). No edgelm import here,
    so the peers' workers load only their own libraries."""
    status = Path("/proc/self/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmHWM:")).split()[1]) / 1024


def prompt_ids(length: int, vocab: int, eos: int) -> list:
    ids = np.random.default_rng(length).integers(0, vocab, size=length)
    return [int(i) if i != eos else int(i) - 1 for i in ids]


# --- workers: one system, one process, three figures ---------------------------------------------------


def worker(
    system: str, model_path: Path, threads: int, vocab: int, eos: int, sampled: list, new_tokens: int = NEW_TOKENS
) -> dict:
    """sampled: [(key, GenerationConfig options)] to time as well, for the systems with a sampler chain."""
    kind = system.split("-")[0]
    short, long = prompt_ids(8, vocab, eos), prompt_ids(512, vocab, eos)
    run = RUNNERS[kind](system, model_path, threads)  # run(prompt, n, options=None) -> Timing
    run(short, 8)  # warm-up
    cpu = time.process_time()
    greedy = run(short, new_tokens)
    cpu = time.process_time() - cpu  # every thread of this worker: the prefill of 8 tokens and the decode steps
    long_prompt = run(long, new_tokens)
    figures = {
        "decode_tok_s": greedy.decode_tok_s,
        "decode_cpu_ms": 1000 * cpu / greedy.tokens,
        "ttft_512_ms": 1000 * long_prompt.first_s,
        "decode_after_512_tok_s": long_prompt.decode_tok_s,
        "tokens": min(greedy.tokens, long_prompt.tokens),
    }
    for key, options in sampled if kind in SAMPLERS else []:
        rate = run(short, new_tokens, options).decode_tok_s
        figures.update({f"{key}_tok_s": rate, f"{key}_over_greedy": rate / figures["decode_tok_s"]})
    return figures | {"peak_rss_mb": peak_rss_mb()}


@dataclass(frozen=True)
class Timing:
    """One generation: the prompt to the first token, the first token to the last, and how many tokens came."""

    first_s: float
    rest_s: float
    tokens: int

    @property
    def decode_tok_s(self) -> float:
        return (self.tokens - 1) / self.rest_s  # the decode steps after the first token, over their time


def take(stream, n: int):
    """The first n items of stream, asking it for no more. (zip(stream, range(n)) asks the stream for an
    (n + 1)th item before range runs out: for llama-cpp-python's generate() one more decode step, inside the
    timing.)"""
    if n <= 0:
        return
    for count, item in enumerate(stream, 1):
        yield item
        if count == n:
            return


def timed(stream, n: int) -> Timing:
    """Times up to n items of a token stream, counting them as they come."""
    started = time.perf_counter()
    first, tokens = None, 0
    for _ in take(stream, n):
        tokens += 1
        first = first or time.perf_counter()
    if tokens < 2:
        raise RuntimeError(f"the system gave {tokens} token(s) where {n} were asked for: no decode step to time")
    return Timing(first - started, time.perf_counter() - first, tokens)


def _edgelm(system, path, threads):
    import edgelm.runtime as edgelm
    import numpy as np
    from edgelm.runtime.batching.step import id_steps
    from edgelm.runtime.generation_config import GenerationConfig

    model = edgelm.load(path, device="cpu", threads=threads)

    def run(prompt, n, options=None):
        config = GenerationConfig(
            max_new_tokens=n, ignore_eos=True, eos_token_id=model.arch.eos_token_id, **(options or {})
        )
        return timed(id_steps(model.engine, [prompt], config, model.pad_id, [np.random.default_rng(0)]), n)

    return run


def _transformers(system, path, threads):
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(threads)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    return _hf_generate(model, torch)


def _optimum(system, path, threads):
    import onnxruntime as ort
    import torch
    from optimum.onnxruntime import ORTModelForCausalLM

    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    model = ORTModelForCausalLM.from_pretrained(path, session_options=options, use_cache=True, use_io_binding=True)
    return _hf_generate(model, torch)


def _hf_generate(model, torch):
    """Time the first token with max_new_tokens=1, then the whole run; rest = whole - first."""

    def run(prompt, n):
        ids = torch.tensor([prompt])
        with torch.no_grad():
            started = time.perf_counter()
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=1, do_sample=False, pad_token_id=0)
            first = time.perf_counter() - started
            started = time.perf_counter()
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=n,
                min_new_tokens=n,
                do_sample=False,
                pad_token_id=0,
            )
            return Timing(first, time.perf_counter() - started - first, out.shape[1] - len(prompt))

    return run


def _genai(system, path, threads):
    import onnxruntime_genai as og

    config = og.Config(str(path))
    session = {"intra_op_num_threads": threads, "inter_op_num_threads": 1}
    config.overlay(json.dumps({"model": {"decoder": {"session_options": session}}}))
    model = og.Model(config)

    def run(prompt, n):
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=len(prompt) + n, min_length=len(prompt) + n, do_sample=False)
        generator = og.Generator(model, params)

        def steps():
            generator.append_tokens(prompt)  # the prefill: timed as part of the first token
            while not generator.is_done():
                generator.generate_next_token()
                yield

        return timed(steps(), n)

    return run


def _ct2(system, path, threads):
    import ctranslate2

    generator = ctranslate2.Generator(str(path), device="cpu", intra_threads=threads, inter_threads=1)
    vocabulary = json.loads((Path(path) / "vocabulary.json").read_text())  # CTranslate2 takes token strings

    def run(prompt, n):
        tokens = [vocabulary[i] for i in prompt]
        return timed(generator.generate_tokens(tokens, max_length=n, sampling_topk=1, end_token=[]), n)

    return run


def _llama(system, path, threads):
    from llama_cpp import Llama

    model = Llama(
        str(path / "model.gguf"),
        n_ctx=1024,
        n_threads=threads,
        n_threads_batch=threads,
        n_batch=512,
        verbose=False,
        flash_attn=not system.endswith("-nofa"),
    )

    def run(prompt, n, options=None):
        model.reset()
        model.set_seed(0)
        return timed(model.generate(prompt, reset=True, **_llama_sampling(options or {})), n)

    return run


def _llama_sampling(options: dict) -> dict:
    """GenerationConfig options -> llama-cpp-python's generate() arguments, every other sampler off."""
    if not options.get("do_sample"):
        return {"top_k": 1, "temp": 0.0}
    return {
        "temp": options.get("temperature", 1.0),
        "top_k": options.get("top_k", 50),  # GenerationConfig's default; 0 is off in both
        "top_p": options.get("top_p", 1.0),
        "min_p": 0.0,
        "typical_p": 1.0,
        "repeat_penalty": options.get("repetition_penalty", 1.0),
        "presence_penalty": options.get("presence_penalty", 0.0),
        "frequency_penalty": options.get("frequency_penalty", 0.0),
    }


# llama-cpp-python 0.3.36 built with GGML_NATIVE on a CPU with AMX multiplies q8_0 and q4_0 with ggml's AMX
# kernels, which crash in ggml_backend_amx_mul_mat at the first prompt (ggml-org/llama.cpp issue 20824); f32 runs.
AMX_CRASH = (
    "; SIGSEGV: on a CPU with AMX, rebuild llama-cpp-python without its AMX kernels: CMAKE_ARGS='-DGGML_NATIVE=OFF "
    "-DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX_VNNI=ON -DGGML_AVX512=ON "
    "-DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF "
    "-DGGML_AMX_BF16=OFF' "
    "pip install --force-reinstall --no-deps --no-binary llama-cpp-python llama-cpp-python"
)
SAMPLERS = ("edgelm", "llama.cpp")  # the systems timed with the sampled settings too
RUNNERS = {
    "edgelm": _edgelm,
    "transformers": _transformers,
    "optimum": _optimum,
    "genai": _genai,
    "ct2": _ct2,
    "llama.cpp": _llama,
}


# --- the driver -----------------------------------------------------------------------------------------


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--checkpoint", type=Path, help="a checkpoint folder (default: distilgpt2-shaped, random weights)"
    )
    parser.add_argument("--shape", help="instead: a random checkpoint of benchmarks/configs/SHAPE.json")
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument(
        "--huge-pages",
        action="store_true",
        help="run every worker with GLIBC_TUNABLES=glibc.malloc.hugetlb=1 (what edgelm serve and bench set for themselves on int8 packages)",
    )
    parser.add_argument("--new-tokens", type=int, default=NEW_TOKENS, help="tokens each decode figure times")
    parser.add_argument("--greedy-only", action="store_true", help="leave out the sampled settings' decodes")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--sampled", default="[]", help=argparse.SUPPRESS)  # JSON [(key, options)] for the worker
    args = parser.parse_args()
    sys.path.insert(0, str(HERE))
    sys.path.insert(0, str(HERE.parent / "tools"))  # tools/distilgpt2_checkpoint.py
    if args.shape:
        from random_checkpoint import build as build_shape

        args.checkpoint = build_shape(args.shape)
    elif args.checkpoint is None:
        from distilgpt2_checkpoint import build

        args.checkpoint = build(HERE / "out" / "distilgpt2-random")
    config = json.loads((args.checkpoint / "config.json").read_text())
    if args.worker:
        vocab, eos, sampled = config["vocab_size"], config["eos_token_id"], json.loads(args.sampled)
        print(json.dumps(worker(args.worker, args.model, args.threads, vocab, eos, sampled, args.new_tokens)))
        return
    from harness import SAMPLED  # the settings harness.py times, greedy excluded
    from peer_load import load_between, rounds_to_summarize, snapshot
    from peer_prepare import prepare
    from peer_report import format_sampled_table, format_table

    sampled = "[]" if args.greedy_only else json.dumps([(key, options) for key, _, options in SAMPLED if options])
    systems = args.systems.split(",")
    paths, results, failed, loads = {}, {s: {} for s in systems}, {}, []
    for system in systems:
        try:
            paths[system] = prepare(system, args.checkpoint)
        except Exception as error:  # a peer that cannot be prepared here is reported, not fatal
            failed[system] = f"prepare: {type(error).__name__}: {str(error)[:200]}"
    env = {
        **os.environ,
        "OMP_NUM_THREADS": str(args.threads),
        **({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"} if args.huge_pages else {}),
    }
    for round_ in range(args.rounds):
        order = [s for s in systems if s in paths and s not in failed]
        before = snapshot()
        for system in order if round_ % 2 == 0 else order[::-1]:  # every other round backwards: drift evens out
            command = [sys.executable, __file__, "--worker", system, "--model", str(paths[system])]
            command += ["--threads", str(args.threads), "--checkpoint", str(args.checkpoint), "--sampled", sampled]
            command += ["--new-tokens", str(args.new_tokens)]
            done = subprocess.run(command, capture_output=True, text=True, env=env)
            if done.returncode != 0:
                failed[system] = (
                    done.stderr.strip().splitlines()[-1][:300] if done.stderr.strip() else f"exit {done.returncode}"
                ) + (AMX_CRASH if done.returncode == -11 and system.startswith("llama.cpp") else "")
                continue
            results[system][round_] = json.loads(done.stdout.strip().splitlines()[-1])
            print(f"round {round_ + 1}: {system} {results[system][round_]}", file=sys.stderr, flush=True)
        loads.append(load_between(before, snapshot()))
        print(f"round {round_ + 1}: {loads[-1].describe()}", file=sys.stderr, flush=True)
    kept, which = rounds_to_summarize(loads)
    table = {}
    for system, by_round in results.items():
        rows = [by_round[r] for r in kept if r in by_round] or list(by_round.values())
        if rows:
            table[system] = {k: float(np.median([row[k] for row in rows])) for k in rows[0]}
    pages = "every worker on glibc.malloc.hugetlb=1" if args.huge_pages else "default malloc"
    heading = f"{args.rounds} rounds, {args.threads} threads, batch 1, {args.new_tokens} greedy tokens, {pages}"
    print("\n".join(f"round {i + 1}: {load.describe()}" for i, load in enumerate(loads)))
    print(which)
    print(format_table(table, failed, heading))
    print(format_sampled_table(table, json.loads(sampled), args.new_tokens))
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "medians": table,
                    "medians_over_rounds": [r + 1 for r in kept],
                    "per_round": {s: {r + 1: row for r, row in by_round.items()} for s, by_round in results.items()},
                    "loads": [asdict(load) | {"contended": load.contended} for load in loads],
                    "failed": failed,
                    "rounds": args.rounds,
                    "threads": args.threads,
                    "huge_pages": args.huge_pages,
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
