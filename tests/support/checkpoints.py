"""Tiny random GPT-2 checkpoints, with a tiny byte-level BPE tokenizer, built on the spot (export side only), and
the bytes of what a package exported from one stores as its graph."""

import json
from pathlib import Path

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Once upon a time, in a land far away, there lived a keeper of lighthouses.",
    "import numpy as np\nprint(np.arange(10))",
    "Émile a visité Tokyo et Kyoto au printemps.",
    "Numbers: 0 1 2 3 4 5 6 7 8 9, and symbols !? ;:",
] * 20


def build_tokenizer(folder: Path, vocab_size: int = 320):
    """A ByteLevel BPE like GPT-2's (all 256 bytes, <|endoftext|>), saved the way transformers saves GPT-2."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2TokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS, trainer)
    fast = GPT2TokenizerFast(
        tokenizer_object=tokenizer, bos_token="<|endoftext|>", eos_token="<|endoftext|>", unk_token="<|endoftext|>"
    )
    fast.save_pretrained(folder)
    return fast


def build_checkpoint(
    folder,
    n_layer=2,
    n_head=4,
    n_embd=32,
    n_positions=64,
    seed=0,
    safetensors=True,
    init_scale=0.3,
    tokenizer_folder=None,
    **variant,
):
    """Random GPT2LMHeadModel weights + tokenizer in a Hugging Face folder. init_scale > 0.02 makes the
    next-token distributions peaked, like a trained model's, so top-1 comparisons mean something. `variant`:
    more GPT2Config settings (tie_word_embeddings, n_inner, activation_function, scale_attn_weights, ...)."""
    import shutil

    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if tokenizer_folder is not None:
        for f in Path(tokenizer_folder).iterdir():
            if f.is_file() and not f.name.startswith(("LICENSE", "model.", "pytorch_model.")):
                shutil.copy(f, folder / f.name)
        vocab = json.loads((folder / "tokenizer.json").read_text())["model"]["vocab"]
        vocab_size, eos = len(vocab), vocab["<|endoftext|>"]
    else:
        tok = build_tokenizer(folder)
        vocab_size, eos = len(tok), tok.eos_token_id
    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=vocab_size,
        n_positions=n_positions,
        n_embd=n_embd,
        n_layer=n_layer,
        n_head=n_head,
        bos_token_id=eos,
        eos_token_id=eos,
        initializer_range=init_scale,
        **variant,
    )
    model = GPT2LMHeadModel(config).eval()
    model.save_pretrained(folder, safe_serialization=safetensors)
    return folder


def copy_with_config(checkpoint: Path, folder: Path, **changes) -> Path:
    """A copy of `checkpoint` in `folder` whose config.json has `changes` over its own values."""
    import shutil

    shutil.copytree(checkpoint, folder)
    config = json.loads((folder / "config.json").read_text()) | changes
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def graph_bytes(package: Path) -> int:
    """model.onnx and model.onnx.data together: the weights and the graph that reads them."""
    return sum((package / name).stat().st_size for name in ("model.onnx", "model.onnx.data"))
