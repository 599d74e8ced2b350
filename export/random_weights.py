"""A checkpoint of a published GPT-2-family shape with random weights, for a first run with no model hub.

`edgelm export distilgpt2 --random-weights` builds one and exports it like any other checkpoint: the package has
the real model's size and speed, and GPT-2's real tokenizer (shipped with edgelm in export/data/), but its text is
noise. The shapes are the published config.json numbers of each model; the weights are drawn as transformers
initialises a new model (normal, standard deviation initializer_range), from a seed, so two runs with one seed
make the same package.
"""

import gzip
import json
from pathlib import Path

from .errors import ExportError

DATA = Path(__file__).parent / "data"
TOKENIZER = DATA / "gpt2-tokenizer.json.gz"  # GPT-2's byte-level BPE, 50,257 tokens (export/data/README.md)

_GPT2 = {
    "model_type": "gpt2",
    "architectures": ["GPT2LMHeadModel"],
    "activation_function": "gelu_new",
    "vocab_size": 50257,
    "n_positions": 1024,
    "n_ctx": 1024,
    "n_embd": 768,
    "n_head": 12,
    "n_inner": None,
    "layer_norm_epsilon": 1e-05,
    "initializer_range": 0.02,
    "bos_token_id": 50256,
    "eos_token_id": 50256,
}
# Each hub id's published shape: what differs from GPT-2's base config above.
SHAPES = {
    "distilgpt2": {"n_layer": 6},
    "gpt2": {"n_layer": 12},
    "gpt2-medium": {"n_layer": 24, "n_embd": 1024, "n_head": 16},
}
_END = "<|endoftext|>"


def random_checkpoint(model: str, folder: Path, seed: int = 0) -> Path:
    """Write `model`'s shape (a key of SHAPES) with random weights drawn from `seed`, and GPT-2's tokenizer, into
    `folder` (config.json, model.safetensors and the tokenizer files, as save_pretrained writes them)."""
    if model not in SHAPES:
        raise ExportError(
            f"--random-weights knows the shapes of {', '.join(SHAPES)}, not {model!r}: give one of them."
        )
    if not isinstance(seed, int) or not 0 <= seed < 2**32:
        raise ExportError(f"--seed must be a whole number from 0 to {2**32 - 1}, not {seed!r}.")
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    config = GPT2Config.from_dict(_GPT2 | SHAPES[model])
    GPT2LMHeadModel(config).eval().save_pretrained(folder)
    (folder / "tokenizer.json").write_bytes(gzip.decompress(TOKENIZER.read_bytes()))
    special = {"content": _END, "lstrip": False, "normalized": True, "rstrip": False, "single_word": False}
    tokenizer_config = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {"50256": special | {"special": True}},
        "bos_token": _END,
        "eos_token": _END,
        "unk_token": _END,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 1024,
        "tokenizer_class": "GPT2Tokenizer",
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))
    (folder / "special_tokens_map.json").write_text(
        json.dumps({"bos_token": special, "eos_token": special, "unk_token": special}, indent=2)
    )
    return folder
