"""Build a checkpoint of distilgpt2's exact shape with random weights (no hub needed): same size and speed
as the real model. Used by the benchmarks; `python tools/distilgpt2_checkpoint.py OUT` makes one."""

import json
import shutil
import sys
from pathlib import Path

SHARED = Path(__file__).resolve().parents[2] / "shared"


def build(out: Path, shared: Path = SHARED, seed: int = 0) -> Path:
    """config from shared/distilgpt2-config.json, tokenizer from shared/gpt2-tokenizer, weights N(0, 0.02) as HF initialises them."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    out = Path(out)
    if (out / "model.safetensors").exists():
        return out
    config_path, tokenizer_dir = shared / "distilgpt2-config.json", shared / "gpt2-tokenizer"
    if not config_path.exists() or not (tokenizer_dir / "tokenizer.json").exists():
        sys.exit(f"need {config_path} and {tokenizer_dir}/tokenizer.json (the project's ../shared folder)")
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(GPT2Config.from_dict(json.loads(config_path.read_text()))).eval()
    model.save_pretrained(out)
    copy_tokenizer(tokenizer_dir, out)
    return out


def copy_tokenizer(tokenizer_dir: Path, out: Path) -> None:
    """The tokenizer's files (not its licence) into the checkpoint folder `out`."""
    for f in tokenizer_dir.iterdir():
        if f.is_file() and not f.name.startswith("LICENSE"):
            shutil.copy(f, out / f.name)


if __name__ == "__main__":
    if len(sys.argv) > 2 or any(a.startswith("-") for a in sys.argv[1:]):
        sys.exit(f"usage: {sys.argv[0]} [OUT]   (default: benchmarks/out/distilgpt2-random)")
    print(build(Path(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/out/distilgpt2-random")))
