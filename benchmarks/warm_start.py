"""A new conversation's first token with a long system prompt: cold, from the package's prompt cache, and after a
restart with --prefix-cache-dir.

    python benchmarks/warm_start.py [--shape distilgpt2 --shape smollm2-135m] [--system-tokens 1500] [--rounds 7]
    python benchmarks/warm_start.py --shape tiny --system-tokens 300 --rounds 2     # a check that it runs

Each shape's checkpoint has random weights (tools/distilgpt2_checkpoint.py, benchmarks/random_checkpoint.py;
"tiny" is distilgpt2's with 2 layers of width 64) and GPT-2's tokenizer, and is exported once under
benchmarks/out (float32, --no-validate, a ChatML template): a plain package, and a copy with the system prompt's
conversation start stored in it (export/prompt_cache.py, as `edgelm export --system-prompt` does). The system
prompt is the first --system-tokens tokens of the export's evaluation text. Each round's conversation is the
system prompt and a new user message (about 20 tokens); three ways to its first token, after the same settle:

    cold      the plain package, no cache: the whole prompt is prefilled (in passes broken at the conversation
              start's end, as every chat with a system prompt is: runtime/engine/passes.py)
    package   the package with the prompt cache: the whole conversation start is restored, the rest prefilled
    restart   the plain package with --prefix-cache-dir (prefix_cache_mb 64, the CLI's default), loaded afresh each
              round (a restarted server: it reads the folder's blocks at load, not timed) over a folder an earlier
              process filled with the conversation start's blocks

Prints medians (ms), each way's ratio to cold (median of per-round ratios), the disk bytes per cached token (the
prompt cache file's size / its tokens, beside 2 x layers x kv_heads x head_dim x 4), the CPU model and the load
average before and after. Every warm run's logits must equal the cold run's, every bit ("same logits").
"""

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tools"))  # tools/distilgpt2_checkpoint.py
OUT = HERE / "out"
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
USERS = [f"Question {r}: which of the sisters went to Bath, and why did she go there?" for r in range(100)]


def checkpoint(shape: str) -> Path:
    if shape == "distilgpt2":
        from distilgpt2_checkpoint import build

        return build(OUT / "distilgpt2-random")
    if shape == "tiny":
        return tiny_checkpoint(OUT / "warm-start-tiny-random")
    from random_checkpoint import build

    return build(shape)


def tiny_checkpoint(out: Path) -> Path:
    import torch
    from distilgpt2_checkpoint import SHARED, copy_tokenizer
    from transformers import GPT2Config, GPT2LMHeadModel

    if not (out / "model.safetensors").exists():
        config = json.loads((SHARED / "distilgpt2-config.json").read_text()) | {"n_layer": 2, "n_embd": 64, "n_head": 4}
        torch.manual_seed(0)
        GPT2LMHeadModel(GPT2Config.from_dict(config)).eval().save_pretrained(out)
        copy_tokenizer(SHARED / "gpt2-tokenizer", out)
    return out


def packages(shape: str, system_prompt: str) -> tuple[Path, Path]:
    """The plain package (exported once) and its copy with the system prompt's cache, made again on every run: the
    cache is what the export code of the working tree stores."""
    from edgelm.export.prompt_cache import add_prompt_cache
    from edgelm.export.stages import export_model

    plain, cached = OUT / f"warm-start-{shape}", OUT / f"warm-start-{shape}-cached"
    if not (plain / "manifest.json").exists():
        export_model(str(checkpoint(shape)), plain, validate=False, force=True, chat_template=CHATML)
    shutil.rmtree(cached, ignore_errors=True)
    shutil.copytree(plain, cached)
    add_prompt_cache(cached, system_prompt)
    return plain, cached


def system_prompt_of(tokens: int) -> str:
    from edgelm.export.stages import DEFAULT_EVAL_TEXT
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(HERE.parents[1] / "shared" / "gpt2-tokenizer" / "tokenizer.json"))
    ids = tokenizer.encode(DEFAULT_EVAL_TEXT.read_text(encoding="utf-8")).ids[:tokens]
    return tokenizer.decode(ids)


def first_token(model, messages) -> tuple[float, np.ndarray]:
    """Seconds from the chat's messages to its first token (greedy), and the logits it was picked from."""
    from edgelm.runtime.batching.step import id_steps
    from edgelm.runtime.generation_config import GenerationConfig

    config = GenerationConfig(max_new_tokens=1, ignore_eos=True, eos_token_id=model.arch.eos_token_id)
    started = time.perf_counter()
    _, logits = next(id_steps(model.engine, [model.chat_ids(messages)], config, model.pad_id))
    return time.perf_counter() - started, logits.copy()


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def run_shape(shape: str, args) -> None:
    import edgelm.runtime as edgelm
    from harness import SETTLE_S

    system = system_prompt_of(args.system_tokens)
    plain, cached = packages(shape, system)
    options = dict(device="cpu", threads=args.threads)
    cold, warm = edgelm.load(plain, **options), edgelm.load(cached, **options)
    record = warm.package.manifest.prompt_cache
    a = warm.arch
    with tempfile.TemporaryDirectory(prefix="edgelm-warm-start-") as folder:
        restart = dict(options, prefix_cache_mb=64, prefix_cache_dir=folder)
        hello = [{"role": "system", "content": system}, {"role": "user", "content": "Hi"}]
        first_token(edgelm.load(plain, **restart), hello)  # an earlier process fills the folder
        times, ratios, same = {"cold": [], "package": [], "restart": []}, {"package": [], "restart": []}, True
        for r in range(args.rounds):
            messages = [{"role": "system", "content": system}, {"role": "user", "content": USERS[r % len(USERS)]}]
            restarted = edgelm.load(plain, **restart)  # a new process's memory: only the folder remembers
            seconds = {}
            for way, model in (("cold", cold), ("package", warm), ("restart", restarted)):
                time.sleep(SETTLE_S)
                seconds[way], logits = first_token(model, messages)
                reference = logits if way == "cold" else reference
                same = same and np.array_equal(logits, reference)
                times[way].append(seconds[way])
            for way in ratios:
                ratios[way].append(seconds[way] / seconds["cold"])
        prompt = len(cold.chat_ids(messages))
    size = (cached / record.file).stat().st_size
    formula = 2 * a.n_layer * a.kv_heads * a.head_size * 4
    median = lambda values: float(np.median(values))  # noqa: E731
    print(
        f"| {shape} | {prompt} | {record.tokens} | {median(times['cold']) * 1e3:.1f} | "
        f"{median(times['package']) * 1e3:.1f} | {median(times['restart']) * 1e3:.1f} | "
        f"{median(ratios['package']):.3f} | {median(ratios['restart']):.3f} | {size / record.tokens:,.0f} "
        f"({formula:,}) | {'yes' if same else 'NO'} |"
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", action="append", help="distilgpt2, smollm2-135m (benchmarks/configs/), or tiny")
    parser.add_argument("--system-tokens", type=int, default=1500)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    shapes = args.shape or ["distilgpt2", "smollm2-135m"]
    print(f"CPU: {cpu_model()}; load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"{args.rounds} rounds, {args.threads} threads, a {args.system_tokens}-token system prompt (float32)")
    print("| shape | prompt | cached | cold ms | package ms | restart ms | package / cold | restart / cold "
          "| disk bytes per cached token (formula) | same logits |")  # fmt: skip
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | :---: |")
    for shape in shapes:
        run_shape(shape, args)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
