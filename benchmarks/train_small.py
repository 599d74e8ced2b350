"""Train a small GPT-2 or Llama checkpoint on real English text, so quantization error can be measured on it.

    benchmarks/austen_text.sh                                   # the texts, into benchmarks/out/austen
    python benchmarks/train_small.py gpt2  [--steps 600] [--out DIR]
    python benchmarks/train_small.py llama [--steps 600] [--out DIR]
    python benchmarks/train_small.py gpt2-draft  [--text python-docs]    # a draft/target pair of one tokenizer
    python benchmarks/train_small.py gpt2-target [--text python-docs]

Random weights hide quantization error: their next-token distributions are nearly flat, so a 4-bit package can
even score a lower perplexity than its float32 source. A model trained for a few hundred steps on real text has
peaked distributions and real outliers in its weights, which is what quantization has to preserve.

Both shapes are 4 layers of width 192 (the embedding is most of their 10-12M parameters) with GPT-2's real
tokenizer (../shared/gpt2-tokenizer), trained on five of Jane Austen's novels; Persuasion is held out and its
perplexity printed at the end (export/data/ ships an extract of it as the export's evaluation sample).
The Llama shape has grouped-query attention (6 query heads, 2 key/value heads) and a tied embedding, like
SmolLM2. Seeded, single process, CPU: 600 steps of 8 x 256 tokens take a few minutes on 2 cores.
Writes a transformers checkpoint folder (safetensors, config, tokenizer) that `edgelm export` reads.

`--repeats F` makes a share F of each batch's rows a span of the text followed by the same span again (a blank
line between them), as web text repeats itself (quotations, boilerplate, code): a model this small, trained this
briefly on novels alone, never learns to continue a passage it has already seen in its context, and so cannot
quote or extract from a prompt as the models users run do; prompt lookup's gains on those tasks need one that can.
The loss is taken over the whole row, so the second copy teaches the copying.

gpt2-draft (2 layers of width 128) and gpt2-target (6 layers of width 384, about 30M parameters: the largest
GPT-2 shape 600 steps train in about an hour of 2 cores) share GPT-2's tokenizer: a draft model and its target
for speculative decoding (benchmarks/speculative.py --draft). `--text python-docs` trains on an English text
every Python has offline, where Austen's novels cannot be fetched: the documentation of the language in the
standard library's pydoc_data (the reference's topics: prose with code), the last tenth of the topics held out.
"""

import argparse
import json
import math
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from distilgpt2_checkpoint import copy_tokenizer  # noqa: E402  tools/distilgpt2_checkpoint.py

HERE = Path(__file__).resolve().parent
SHARED = HERE.parents[1] / "shared"
HELD_OUT = "persuasion"
EOS = 50_256

SHAPES = {
    "gpt2": dict(
        model_type="gpt2", vocab_size=50_257, n_positions=512, n_embd=192, n_layer=4, n_head=6,
        bos_token_id=EOS, eos_token_id=EOS, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    ),
    "gpt2-draft": dict(
        model_type="gpt2", vocab_size=50_257, n_positions=512, n_embd=128, n_layer=2, n_head=4,
        bos_token_id=EOS, eos_token_id=EOS, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    ),
    "gpt2-target": dict(
        model_type="gpt2", vocab_size=50_257, n_positions=512, n_embd=384, n_layer=6, n_head=6,
        bos_token_id=EOS, eos_token_id=EOS, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    ),
    "llama": dict(
        model_type="llama", vocab_size=50_257, max_position_embeddings=512, hidden_size=192,
        intermediate_size=512, num_hidden_layers=4, num_attention_heads=6, num_key_value_heads=2,
        rms_norm_eps=1e-5, rope_theta=10_000.0, tie_word_embeddings=True, bos_token_id=EOS, eos_token_id=EOS,
    ),
}  # fmt: skip


def paragraphs(text: str) -> str:
    """Gutenberg's hard-wrapped lines joined into one line per paragraph, paragraphs apart by a blank line."""
    joined = (" ".join(line.strip() for line in block.splitlines()).strip() for block in re.split(r"\n\s*\n", text))
    return "\n\n".join(p for p in joined if p) + "\n"


def token_stream(texts: list[str], tokenizer):
    import numpy as np

    ids = []
    for text in texts:
        ids.extend(tokenizer.encode(paragraphs(text)).ids)
        ids.append(EOS)
    return np.asarray(ids, dtype=np.int64)


def corpus(source: str, text_dir: Path) -> tuple[list[str], list[str], list[str], str]:
    """(training texts, their names, held-out texts, the held-out name) of "austen" (text_dir's novels) or
    "python-docs" (pydoc_data's topics, sorted by name, the last tenth held out)."""
    if source == "python-docs":
        from pydoc_data.topics import topics

        names = sorted(topics)
        cut = len(names) - max(1, len(names) // 10)
        return [topics[n] for n in names[:cut]], names[:cut], [topics[n] for n in names[cut:]], "pydoc topics " + (
            f"{names[cut]}..{names[-1]}"
        )
    books = sorted(p for p in text_dir.glob("*.txt") if p.stem != HELD_OUT)
    if len(books) < 2 or not (text_dir / f"{HELD_OUT}.txt").exists():
        raise SystemExit(
            f"need Austen's novels in {text_dir}: run benchmarks/austen_text.sh first (or use --text python-docs)"
        )
    read = lambda path: path.read_text(encoding="utf-8")  # noqa: E731
    return [read(p) for p in books], [p.stem for p in books], [read(text_dir / f"{HELD_OUT}.txt")], HELD_OUT


def repeated_row(ids, start: int, context: int, blank) -> "np.ndarray":
    """A row of `context` ids: the span of `ids` at `start`, a blank line, then the same span again."""
    import numpy as np

    half = (context - len(blank)) // 2
    span = ids[start : start + half]
    row = np.concatenate([span, blank, span])
    return np.concatenate([row, ids[start + half : start + half + context - len(row)]])


def train(family: str, text_dir: Path, out: Path, steps: int, batch: int, context: int, lr: float, seed: int,
          source: str = "austen", repeats: float = 0.0):  # fmt: skip
    import numpy as np
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    tokenizer = Tokenizer.from_file(str(SHARED / "gpt2-tokenizer" / "tokenizer.json"))
    texts, names, held_texts, held_name = corpus(source, text_dir)
    train_ids = token_stream(texts, tokenizer)
    held_ids = token_stream(held_texts, tokenizer)[: 64 * context]
    config = AutoConfig.for_model(**SHAPES[family])
    model = AutoModelForCausalLM.from_config(config)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    other = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}], lr=lr)
    warmup = max(1, steps // 20)
    schedule = lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / steps)))  # noqa: E731
    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    rng = np.random.default_rng(seed)
    blank = np.asarray(tokenizer.encode("\n\n").ids, dtype=np.int64)
    started = time.perf_counter()
    model.train()
    for step in range(steps):
        starts = rng.integers(0, len(train_ids) - context - 1, size=batch)
        twice = rng.random(batch) < repeats if repeats else [False] * batch  # no draw: seeds give the same rows
        rows = [repeated_row(train_ids, s, context, blank) if t else train_ids[s : s + context]
                for s, t in zip(starts, twice)]  # fmt: skip
        x = torch.from_numpy(np.stack(rows))
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 50 == 0 or step == steps - 1:
            print(f"step {step:4d}  loss {loss.item():.3f}  {time.perf_counter() - started:6.0f} s", flush=True)
    model.eval()
    with torch.no_grad():
        windows = torch.from_numpy(held_ids[: len(held_ids) // context * context].reshape(-1, context))
        held = sum(model(input_ids=w[None], labels=w[None]).loss.item() for w in windows) / len(windows)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    copy_tokenizer(SHARED / "gpt2-tokenizer", out)
    summary = {
        "family": family,
        "steps": steps,
        "batch": batch,
        "context": context,
        "text": source,
        "repeats": repeats,
        "train_tokens": int(len(train_ids)),
        "train_books": names if source == "austen" else f"{len(names)} topics",
        "held_out": held_name,
        "held_out_tokens": int(windows.numel()),
        "held_out_perplexity": round(math.exp(held), 2),
        "seconds": round(time.perf_counter() - started, 1),
    }
    (out / "training.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary))
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("family", choices=sorted(SHAPES))
    parser.add_argument("--text-dir", type=Path, default=HERE / "out" / "austen")
    parser.add_argument("--text", choices=["austen", "python-docs"], default="austen", help="what to train on")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=float, default=0.0, help="share of rows that are a span, then itself again")
    args = parser.parse_args()
    if not 0 <= args.repeats <= 1:
        parser.error("--repeats is a share of the rows, from 0 to 1")
    out = args.out or HERE / "out" / f"{args.family}-{args.text}"
    train(args.family, args.text_dir, out, args.steps, args.batch, args.context, args.lr, args.seed, args.text,
          args.repeats)  # fmt: skip


if __name__ == "__main__":
    main()
