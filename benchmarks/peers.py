"""Side-by-side peer benchmark: the same checkpoint, prompts and threads through every system, interleaved.

    pip install -e '.[export,bench]'
    python benchmarks/peers.py                      # distilgpt2-shaped random checkpoint from ../shared
    python benchmarks/peers.py --checkpoint DIR --rounds 5 --systems edgelm-int8,llama.cpp-q8_0
    python benchmarks/peers.py --shape smollm2-135m --systems llama.cpp-f32,llama.cpp-q8_0,llama.cpp-q4_0

--shape NAME builds a random checkpoint of benchmarks/configs/NAME.json (SmolLM2-135M, Qwen2.5-0.5B) with
GPT-2's tokenizer (benchmarks/random_checkpoint.py says what that changes). Each checkpoint's converted models
are kept under benchmarks/out/peers/CHECKPOINT_FOLDER_NAME/.

Each measurement runs in its own worker process (so peak RSS is that system's alone); rounds go through
every system in turn, so machine noise spreads over all of them. Figures are medians over rounds:
decode tok/s (batch 1, 8-token prompt, 128 greedy tokens), the worker's CPU time per token over that run (all
its threads: with --threads 1 the work a token costs, the figure other processes on the machine move least;
with more threads it counts their spinning too), first token after a 512-token prompt, decode tok/s after that
prompt (128 tokens), and peak RSS of the worker. For edgelm and llama.cpp, also decode tok/s
with each sampled setting of benchmarks/harness.py (harness.SAMPLED: OpenAI's defaults, top_p
0.9, transformers' top_k 50, penalties), through each system's own sampler chain, and its ratio to the same
worker's greedy rate. llama.cpp takes the settings as llama-cpp-python's generate() names them, with min_p
(default 0.05 there) off; its penalties look back over the last 64 tokens (last_n_tokens_size), edgelm's
repetition penalty over the whole context. Not part of CI.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
OUT = HERE / "out" / "peers"
NEW_TOKENS = 128
SYSTEMS = [
    "transformers-fp32",
    "optimum-fp32",
    "genai-fp32",
    "genai-int8",
    "ct2-float32",
    "ct2-int8",
    "llama.cpp-f32",
    "llama.cpp-q8_0",
    "llama.cpp-q4_0",
    "llama.cpp-q8_0-nofa",
    "edgelm-fp32",
    "edgelm-int8",
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


# --- preparing each system's model (once, cached under benchmarks/out/peers) -------------------------


def prepare(system: str, checkpoint: Path) -> Path:
    system = system.removesuffix("-nofa")  # the same model, run without flash attention
    kind, _, variant = system.partition("-")
    target = OUT / checkpoint.resolve().name / system
    if kind in ("transformers",):
        return checkpoint
    if target.exists():
        return target
    if kind == "edgelm":
        from edgelm.export.stages import export_model

        weights, _, cache = variant.partition("-")  # int8-kv8: int8 weights, int8 KV cache
        export_model(
            str(checkpoint),
            target,
            quantize={"fp32": "none"}.get(weights, weights),
            kv_cache="int8" if cache == "kv8" else "float32",
        )
    elif kind in ("optimum", "genai"):
        _prepare_onnx_peer(checkpoint, target, int8=variant == "int8")
    elif kind == "ct2":
        import ctranslate2

        ctranslate2.converters.TransformersConverter(str(checkpoint)).convert(str(target), quantization=variant)
    elif kind == "llama.cpp":
        _prepare_gguf(checkpoint, target, variant)
    return target


def _prepare_onnx_peer(checkpoint: Path, target: Path, int8: bool) -> None:
    base = target.parent / "optimum-fp32"
    if not base.exists():
        from optimum.exporters.onnx import main_export

        main_export(str(checkpoint), output=str(base), task="text-generation-with-past", no_post_process=True)
    if target == base:
        return
    shutil.copytree(base, target)
    if int8:
        from onnxruntime.quantization import QuantType, quantize_dynamic

        quantize_dynamic(str(base / "model.onnx"), str(target / "model.onnx"), weight_type=QuantType.QInt8)
    config = json.loads((checkpoint / "config.json").read_text())
    layers, heads, width = config["n_layer"], config["n_head"], config["n_embd"]
    # onnxruntime-genai has no GPT-2 type; "llama" is its plain decoder loop and runs optimum's graph as it is.
    (target / "genai_config.json").write_text(
        json.dumps(
            {
                "model": {
                    "type": "llama",
                    "context_length": config["n_positions"],
                    "vocab_size": config["vocab_size"],
                    "bos_token_id": config["bos_token_id"],
                    "eos_token_id": config["eos_token_id"],
                    "pad_token_id": config["eos_token_id"],
                    "decoder": {
                        "filename": "model.onnx",
                        "head_size": width // heads,
                        "hidden_size": width,
                        "num_attention_heads": heads,
                        "num_hidden_layers": layers,
                        "num_key_value_heads": heads,
                        "session_options": {
                            "intra_op_num_threads": int(os.environ.get("PEER_THREADS", 2)),
                            "inter_op_num_threads": 1,
                        },
                        "inputs": {
                            "input_ids": "input_ids",
                            "attention_mask": "attention_mask",
                            "position_ids": "position_ids",
                            "past_key_names": "past_key_values.%d.key",
                            "past_value_names": "past_key_values.%d.value",
                        },
                        "outputs": {
                            "logits": "logits",
                            "present_key_names": "present.%d.key",
                            "present_value_names": "present.%d.value",
                        },
                    },
                },
                "search": {
                    "max_length": config["n_positions"],
                    "do_sample": False,
                    "num_beams": 1,
                    "past_present_share_buffer": False,
                },
            },
            indent=2,
        )
    )


def _prepare_gguf(checkpoint: Path, target: Path, variant: str) -> None:
    """convert_hf_to_gguf.py ships in llama-cpp-python's sdist; quantize with the bindings' own call."""
    f32 = target.parent / "llama.cpp-f32" / "model.gguf"
    if not f32.exists():
        source = OUT / "llama-cpp-src"
        if not source.exists():
            import tarfile

            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "--no-binary",
                    ":all:",
                    "--no-deps",
                    "-d",
                    str(OUT / "sdist"),
                    "llama-cpp-python==0.3.36",
                ],
                check=True,
            )
            with tarfile.open(next((OUT / "sdist").glob("llama_cpp_python-*.tar.gz"))) as tar:
                tar.extractall(source)
        script = next(source.glob("*/vendor/llama.cpp/convert_hf_to_gguf.py"))
        if json.loads((checkpoint / "config.json").read_text())["model_type"] != "gpt2":
            try:
                import sentencepiece  # noqa: F401
            except ImportError:
                raise RuntimeError(
                    "convert_hf_to_gguf.py imports sentencepiece for this architecture even with a BPE tokenizer: "
                    "pip install sentencepiece"
                ) from None
        f32.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PYTHONPATH": str(script.parent / "gguf-py")}
        subprocess.run(
            [sys.executable, str(script), str(checkpoint), "--outtype", "f32", "--outfile", str(f32)],
            check=True,
            env=env,
        )
    if variant == "f32":
        return
    import llama_cpp

    target.mkdir(parents=True, exist_ok=True)
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = {"q8_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0, "q4_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0}[variant]
    params.nthread = 2
    if llama_cpp.llama_model_quantize(str(f32).encode(), str(target / "model.gguf").encode(), params) != 0:
        raise RuntimeError(f"llama.cpp could not quantize to {variant}")


# --- workers: one system, one process, three figures ---------------------------------------------------


def worker(system: str, model_path: Path, threads: int, vocab: int, eos: int, sampled: list) -> dict:
    """sampled: [(key, GenerationConfig options)] to time as well, for the systems with a sampler chain."""
    kind = system.split("-")[0]
    short, long = prompt_ids(8, vocab, eos), prompt_ids(512, vocab, eos)
    run = RUNNERS[kind](system, model_path, threads)  # run(prompt, n) -> (seconds to first token, seconds for the rest)
    run(short, 8)  # warm-up
    cpu = time.process_time()
    first, rest = run(short, NEW_TOKENS)
    cpu = time.process_time() - cpu  # every thread of this worker: the prefill of 8 tokens and NEW_TOKENS steps
    ttft, rest_long = run(long, NEW_TOKENS)
    figures = {
        "decode_tok_s": (NEW_TOKENS - 1) / rest,
        "decode_cpu_ms": 1000 * cpu / NEW_TOKENS,
        "ttft_512_ms": 1000 * ttft,
        "decode_after_512_tok_s": (NEW_TOKENS - 1) / rest_long,
    }
    for key, options in sampled if kind in SAMPLERS else []:
        rate = (NEW_TOKENS - 1) / run(short, NEW_TOKENS, options)[1]
        figures.update({f"{key}_tok_s": rate, f"{key}_over_greedy": rate / figures["decode_tok_s"]})
    return figures | {"peak_rss_mb": peak_rss_mb()}


def _timed(stream):
    started = time.perf_counter()
    first = None
    for _ in stream:
        first = first or time.perf_counter()
    return first - started, time.perf_counter() - first


def _edgelm(system, path, threads):
    import edgelm.runtime as edgelm
    import numpy as np
    from edgelm.runtime.engine.decode import decode_steps
    from edgelm.runtime.generation_config import GenerationConfig

    model = edgelm.load(path, device="cpu", threads=threads)

    def run(prompt, n, options=None):
        config = GenerationConfig(
            max_new_tokens=n, ignore_eos=True, eos_token_id=model.arch.eos_token_id, **(options or {})
        )
        return _timed(decode_steps(model.engine, [prompt], config, [np.random.default_rng(0)], model.pad_id))

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
            model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=n,
                min_new_tokens=n,
                do_sample=False,
                pad_token_id=0,
            )
            return first, time.perf_counter() - started - first

    return run


def _genai(system, path, threads):
    import onnxruntime_genai as og

    model = og.Model(str(path))

    def run(prompt, n):
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=len(prompt) + n, min_length=len(prompt) + n, do_sample=False)
        generator = og.Generator(model, params)

        def steps():
            generator.append_tokens(prompt)  # the prefill: timed as part of the first token
            while not generator.is_done():
                generator.generate_next_token()
                yield

        return _timed(steps())

    return run


def _ct2(system, path, threads):
    import ctranslate2

    generator = ctranslate2.Generator(str(path), device="cpu", intra_threads=threads, inter_threads=1)
    vocabulary = json.loads((Path(path) / "vocabulary.json").read_text())  # CTranslate2 takes token strings

    def run(prompt, n):
        return _timed(
            generator.generate_tokens([vocabulary[i] for i in prompt], max_length=n, sampling_topk=1, end_token=[])
        )

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
        stream = model.generate(prompt, reset=True, **_llama_sampling(options or {}))
        return _timed(token for token, _ in zip(stream, range(n)))

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
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--sampled", default="[]", help=argparse.SUPPRESS)  # JSON [(key, options)] for the worker
    args = parser.parse_args()
    sys.path.insert(0, str(HERE))
    if args.shape:
        from random_checkpoint import build as build_shape

        args.checkpoint = build_shape(args.shape)
    elif args.checkpoint is None:
        from distilgpt2_checkpoint import build

        args.checkpoint = build(HERE / "out" / "distilgpt2-random")
    config = json.loads((args.checkpoint / "config.json").read_text())
    if args.worker:
        sampled = json.loads(args.sampled)
        print(
            json.dumps(
                worker(args.worker, args.model, args.threads, config["vocab_size"], config["eos_token_id"], sampled)
            )
        )
        return
    from harness import SAMPLED  # the settings harness.py times, greedy excluded

    sampled = json.dumps([(key, options) for key, _, options in SAMPLED if options])
    systems = args.systems.split(",")
    paths, results, failed = {}, {s: [] for s in systems}, {}
    for system in systems:
        try:
            paths[system] = prepare(system, args.checkpoint)
        except Exception as error:  # a peer that cannot be prepared here is reported, not fatal
            failed[system] = f"prepare: {type(error).__name__}: {str(error)[:200]}"
    for round_ in range(args.rounds):
        for system in [s for s in systems if s in paths and s not in failed]:
            command = [
                sys.executable,
                __file__,
                "--worker",
                system,
                "--model",
                str(paths[system]),
                "--threads",
                str(args.threads),
                "--checkpoint",
                str(args.checkpoint),
                "--sampled",
                sampled,
            ]
            env = {
                **os.environ,
                "OMP_NUM_THREADS": str(args.threads),
                **({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"} if args.huge_pages else {}),
            }
            done = subprocess.run(command, capture_output=True, text=True, env=env)
            if done.returncode != 0:
                failed[system] = (
                    done.stderr.strip().splitlines()[-1][:300] if done.stderr.strip() else f"exit {done.returncode}"
                )
                continue
            results[system].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(f"round {round_ + 1}: {system} {results[system][-1]}", file=sys.stderr, flush=True)
    table = {s: {k: float(np.median([r[k] for r in rs])) for k in rs[0]} for s, rs in results.items() if rs}
    print(format_table(table, failed, args))
    print(format_sampled_table(table, json.loads(sampled)))
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "medians": table,
                    "failed": failed,
                    "rounds": args.rounds,
                    "threads": args.threads,
                    "huge_pages": args.huge_pages,
                    "load_average": os.getloadavg(),
                },
                indent=2,
            )
        )


def format_table(table: dict, failed: dict, args) -> str:
    pages = "every worker on glibc.malloc.hugetlb=1" if args.huge_pages else "default malloc"
    lines = [
        f"{args.rounds} rounds, {args.threads} threads, batch 1, {NEW_TOKENS} greedy tokens, {pages}, load average now {os.getloadavg()[0]:.2f}",
        "| system | decode tok/s | decode CPU ms/token | first token after 512 (ms) | decode after 512 tok/s | peak RSS (MB) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for system, row in table.items():
        lines.append(
            f"| {system} | {row['decode_tok_s']:.1f} | {row['decode_cpu_ms']:.1f} | {row['ttft_512_ms']:.0f} | {row['decode_after_512_tok_s']:.1f} | {row['peak_rss_mb']:.0f} |"
        )
    ratios = [("edgelm-fp32", "transformers-fp32", "decode_tok_s"), ("edgelm-fp32", "llama.cpp-f32", "decode_tok_s")]
    for cache in ("", "-kv8"):
        ratios += [
            (f"edgelm-int8{cache}", "llama.cpp-q8_0", "decode_tok_s"),
            (f"edgelm-int4{cache}", "llama.cpp-q4_0", "decode_tok_s"),
            (f"edgelm-int8{cache}", "llama.cpp-q8_0", "decode_cpu_ms"),
            (f"edgelm-int4{cache}", "llama.cpp-q4_0", "decode_cpu_ms"),
            (f"edgelm-int8{cache}", "llama.cpp-q8_0", "decode_after_512_tok_s"),
            (f"edgelm-int8{cache}", "ct2-int8", "ttft_512_ms"),
            (f"edgelm-int8{cache}", "ct2-int8", "peak_rss_mb"),
        ]
    lines.append("")
    for ours, peer, key in ratios:
        peers = [table[p][key] for p in (peer, peer + "-nofa") if p in table]  # llama.cpp at its best setting
        if ours in table and peers:
            lower_is_better = key in ("ttft_512_ms", "peak_rss_mb", "decode_cpu_ms")
            best = min(peers) if lower_is_better else max(peers)
            if key == "decode_cpu_ms":  # as a speed: the peer's CPU per token over ours
                lines.append(f"{ours} / {peer} decode per CPU second: {best / table[ours][key]:.2f}x")
            else:
                lines.append(f"{ours} / {peer} {key}: {table[ours][key] / best:.2f}x")
    for system, why in failed.items():
        lines.append(f"not measured: {system}: {why}")
    return "\n".join(lines)


def format_sampled_table(table: dict, sampled: list) -> str:
    """Decode tok/s per sampled setting and its ratio to the same worker's greedy rate; edgelm over llama.cpp."""
    keys = [key for key, _ in sampled]
    rows = {s: row for s, row in table.items() if all(f"{k}_tok_s" in row for k in keys)}
    if not rows:
        return ""
    lines = [
        "",
        f"sampled decode, batch 1, {NEW_TOKENS} tokens: tok/s (x the same worker's greedy rate)",
        "| system | greedy | " + " | ".join(keys) + " |",
        "| --- " * (len(keys) + 2) + "|",
    ]
    for system, row in rows.items():
        cells = [f"{row[f'{k}_tok_s']:.1f} ({row[f'{k}_over_greedy']:.2f}x)" for k in keys]
        lines.append(f"| {system} | {row['decode_tok_s']:.1f} | " + " | ".join(cells) + " |")
    for ours, peer in (
        ("edgelm-int8", "llama.cpp-q8_0"),
        ("edgelm-int4", "llama.cpp-q4_0"),
        ("edgelm-fp32", "llama.cpp-f32"),
    ):
        if ours in rows and peer in rows:
            ratios = ", ".join(f"{k} {rows[ours][f'{k}_tok_s'] / rows[peer][f'{k}_tok_s']:.2f}x" for k in keys)
            lines.append(f"{ours} / {peer} sampled decode: {ratios}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
