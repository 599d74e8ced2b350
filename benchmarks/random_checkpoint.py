"""Build a random-weight checkpoint of a published shape (benchmarks/configs/NAME.json) with GPT-2's tokenizer.

    python benchmarks/random_checkpoint.py smollm2-135m [OUT]     # or qwen2.5-0.5b, llama-3.2-1b, tinyllama-1.1b

Same size and speed as the real model, no hub needed. The tokenizer is GPT-2's from ../shared: llama.cpp's
convert_hf_to_gguf.py recognises it (pre-tokenizer "gpt-2"), so every peer can load the checkpoint. Two numbers
change from the published config because of it, and results should say so:
- a vocabulary smaller than GPT-2's 50,257 ids (SmolLM2's 49,152) is rounded up to 50,304, the next multiple of
  64: the converter refuses a tokenizer id >= vocab_size. (The embedding and the output matrix grow by 2.3%.)
  A larger one (Qwen2.5's 151,936) is kept: the converter pads the tokenizer's vocabulary with unused ids.
- bos and eos become GPT-2's <|endoftext|> (50256), and pad_token_id is left unset: transformers initialises the
  pad token's embedding row to zeros, and with pad = bos a one-token prompt would give all-zero logits.
Weights are drawn as transformers initialises them (normal, std initializer_range) and saved in float32.
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from distilgpt2_checkpoint import copy_tokenizer  # noqa: E402  tools/distilgpt2_checkpoint.py

HERE = Path(__file__).resolve().parent
SHARED = HERE.parents[1] / "shared"
GPT2_VOCAB, GPT2_EOS = 50_257, 50_256


def config_of(name: str) -> dict:
    """benchmarks/configs/NAME.json with the changes GPT-2's tokenizer needs (see the module docstring)."""
    config = {k: v for k, v in json.loads((HERE / "configs" / f"{name}.json").read_text()).items() if k[0] != "_"}
    if config["vocab_size"] < GPT2_VOCAB:
        config["vocab_size"] = -(-GPT2_VOCAB // 64) * 64
    config.update(bos_token_id=GPT2_EOS, eos_token_id=GPT2_EOS, torch_dtype="float32")
    config.pop("pad_token_id", None)  # transformers would initialise that token's embedding to zeros
    return config


def build(name: str, out: Path | None = None, shared: Path = SHARED, seed: int = 0) -> Path:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    out = Path(out or HERE / "out" / f"{name}-random")
    if (out / "model.safetensors").exists():
        return out
    tokenizer_dir = shared / "gpt2-tokenizer"
    if not (tokenizer_dir / "tokenizer.json").exists():
        sys.exit(f"need {tokenizer_dir}/tokenizer.json (the project's ../shared folder)")
    config = config_of(name)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**config)).eval()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    copy_tokenizer(tokenizer_dir, out)
    return out


if __name__ == "__main__":
    if not 2 <= len(sys.argv) <= 3 or any(a.startswith("-") for a in sys.argv[1:]):
        sys.exit(
            f"usage: {sys.argv[0]} NAME [OUT]   NAME: {', '.join(p.stem for p in (HERE / 'configs').glob('*.json'))}"
        )
    print(build(sys.argv[1], Path(sys.argv[2]) if len(sys.argv) > 2 else None))
