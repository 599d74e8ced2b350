"""Tiny random Llama and Qwen2 checkpoints (transformers' own classes), with the tests' tiny byte-level BPE and a
ChatML chat template in tokenizer_config.json (export side only)."""

import json
from pathlib import Path

from checkpoints import build_tokenizer

CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
}
# name -> (model_type, config): grouped and ungrouped key/value heads, a head size of 24, tied and untied heads,
# Qwen2's Q/K/V biases, Llama 3's rope scaling.
SHAPES = {
    "llama-gqa": (
        "llama",
        dict(
            hidden_size=64,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=128,
            rope_scaling=LLAMA3_ROPE,
            tie_word_embeddings=True,
        ),
    ),
    "llama-untied": (
        "llama",
        dict(
            hidden_size=96,
            num_attention_heads=4,
            num_key_value_heads=4,
            intermediate_size=160,
            tie_word_embeddings=False,
        ),
    ),
    "qwen2": (
        "qwen2",
        dict(
            hidden_size=64,
            num_attention_heads=4,
            num_key_value_heads=1,
            intermediate_size=128,
            rope_theta=1e6,
            tie_word_embeddings=True,
        ),
    ),
}


def build_llama_checkpoint(
    folder,
    shape: str = "llama-gqa",
    n_layer: int = 2,
    n_positions: int = 64,
    seed: int = 0,
    init_scale: float = 0.3,
    chat_template: str | None = CHATML,
    tokenizer_folder=None,
    **config,
):
    """Random LlamaForCausalLM / Qwen2ForCausalLM weights + tokenizer in a Hugging Face folder. init_scale > 0.02
    makes the next-token distributions peaked, like a trained model's, so top-1 comparisons mean something."""
    import shutil

    import torch
    import transformers

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if tokenizer_folder is not None:
        for f in Path(tokenizer_folder).iterdir():
            if f.is_file() and not f.name.startswith("LICENSE"):
                shutil.copy(f, folder / f.name)
        data = json.loads((folder / "tokenizer.json").read_text())
        ids = data["model"]["vocab"] | {t["content"]: t["id"] for t in data["added_tokens"]}  # Qwen2.5's are added
        vocab_size, eos = max(ids.values()) + 1, ids.get("<|endoftext|>", 0)
    else:
        tok = build_tokenizer(folder)
        vocab_size, eos = len(tok), tok.eos_token_id
    if chat_template is not None:
        path = folder / "tokenizer_config.json"
        path.write_text(json.dumps(json.loads(path.read_text()) | {"chat_template": chat_template}, indent=2))
    model_type, settings = SHAPES[shape]
    name = {"llama": "Llama", "qwen2": "Qwen2"}[model_type]
    torch.manual_seed(seed)
    hf_config = getattr(transformers, name + "Config")(
        **(
            settings
            | dict(
                vocab_size=vocab_size,
                num_hidden_layers=n_layer,
                max_position_embeddings=n_positions,
                bos_token_id=eos,
                eos_token_id=eos,
                initializer_range=init_scale,
            )
            | config
        )
    )
    model = getattr(transformers, name + "ForCausalLM")(hf_config).eval()
    with torch.no_grad():  # transformers starts norms at 1 and biases at 0: random ones test that they are read
        for key, tensor in model.named_parameters():
            if key.endswith(("norm.weight", "bias")):
                tensor.copy_(
                    1 + 0.2 * torch.randn_like(tensor) if key.endswith("weight") else 0.3 * torch.randn_like(tensor)
                )
    model.save_pretrained(folder, safe_serialization=True)
    return folder
