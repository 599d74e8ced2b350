"""The Llama family's weights (one file, or shards listed by model.safetensors.index.json), read one tensor at
a time straight into the layout the graph multiplies by, and checked against the config."""

from pathlib import Path

import numpy as np
from edgelm.runtime.package.format import Architecture

from ...checkpoint import SHARD_INDEX, check_finite, tensors, transposed, weight_files
from ...errors import ExportError
from .packing import PACKED


def read_weights(folder: Path, arch: Architecture) -> tuple[dict[str, np.ndarray], str]:
    """The checkpoint's tensors as float32 NumPy arrays under LlamaForCausalLM's names, checked against arch.

    Read one tensor at a time, each straight into the layout the graph multiplies by (so the export holds the
    weights once, and the PyTorch reference reads the same memory): every projection into its column block of
    the packed [in, out] matrix (packing.PACKED), kept here as a [out, in] view of it; the matrix the LM head
    multiplies by (the untied head, or the tied embedding) as the transposed view of a [C, V] array."""
    files = weight_files(folder)
    places = _places(arch)
    head = "model.embed_tokens.weight" if arch.tie_word_embeddings else "lm_head.weight"
    packed, weights = {}, {}
    for path in files:
        for key, tensor in tensors(path):
            if key.endswith("rotary_emb.inv_freq"):
                continue  # a buffer old checkpoints saved; the graph bakes its own tables
            key = key if key.startswith(("model.", "lm_head.")) else "model." + key
            if key == "lm_head.weight" and arch.tie_word_embeddings:
                continue  # transformers ties it to the embedding whatever the file holds
            if key in places and tuple(tensor.shape) == places[key][2]:
                weights[key] = _place(tensor, *places[key], packed)
            elif key == head and tensor.ndim == 2:
                weights[key] = transposed(tensor)
            else:
                weights[key] = _float32(tensor)
            del tensor  # before the next one is read
            check_finite(key, weights[key], path)
    _check_weights(weights, arch, files[0] if len(files) == 1 else folder / SHARD_INDEX)
    return weights, files[0].name if len(files) == 1 else SHARD_INDEX


def _float32(tensor) -> np.ndarray:
    import torch

    return tensor.detach().to(torch.float32).numpy()


def _places(arch: Architecture) -> dict:
    """HF weight name -> (packed matrix name, its [in, out] shape, the part's [out, in] shape, first column)."""
    shapes = expected_shapes(arch)
    places = {}
    for i in range(arch.n_layer):
        p = f"model.layers.{i}."
        for name, parts in PACKED:
            shape = [shapes[p + part + ".weight"] for part in parts]
            whole = (shape[0][1], sum(out for out, _ in shape))
            column = 0
            for part, (out, width) in zip(parts, shape):
                places[p + part + ".weight"] = (p + name, whole, (out, width), column)
                column += out
    return places


def _place(tensor, name: str, whole: tuple, shape: tuple, column: int, packed: dict) -> np.ndarray:
    """Copy a [out, in] tensor (any float dtype) into its column block of packed[name]; returns the view of it."""
    import torch

    if name not in packed:
        packed[name] = np.empty(whole, dtype=np.float32)
    block = packed[name][:, column : column + shape[0]]
    torch.from_numpy(block).copy_(tensor.detach().T)  # converts and transposes in one pass
    return block.T


def expected_shapes(arch: Architecture) -> dict:
    """Every tensor the config promises, with its shape (torch Linear's [out, in])."""
    C, V, I = arch.n_embd, arch.vocab_size, arch.mlp_width
    q, kv = arch.n_head * arch.head_size, arch.kv_heads * arch.head_size
    shapes = {"model.embed_tokens.weight": (V, C), "model.norm.weight": (C,)}
    if not arch.tie_word_embeddings:
        shapes["lm_head.weight"] = (V, C)
    outputs = {"q_proj": q, "k_proj": kv, "v_proj": kv, "o_proj": C, "gate_proj": I, "up_proj": I, "down_proj": C}
    inputs = {"o_proj": q, "down_proj": I}
    for i in range(arch.n_layer):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = shapes[p + "post_attention_layernorm.weight"] = (C,)
        for name, out in outputs.items():
            part = p + ("self_attn." if name.endswith(("q_proj", "k_proj", "v_proj", "o_proj")) else "mlp.") + name
            shapes[part + ".weight"] = (out, inputs.get(name, C))
            if name in arch.biases:
                shapes[part + ".bias"] = (out,)
    return shapes


def _check_weights(weights: dict, arch: Architecture, path: Path) -> None:
    expected = expected_shapes(arch)
    missing = [k for k in expected if k not in weights]
    if missing:
        raise ExportError(
            f"{path} is missing {len(missing)} weight tensors the config promises (first: {missing[0]}); the checkpoint is incomplete or its config.json is not its own."
        )
    wrong = [
        f"{k} is {list(weights[k].shape)}, the config makes it {list(s)}"
        for k, s in expected.items()
        if weights[k].shape != s
    ]
    unexpected = [k for k in weights if k not in expected and k != "lm_head.weight"]
    if wrong or unexpected:
        problem = wrong[0] if wrong else f"it holds {unexpected[0]}, which the config does not describe"
        raise ExportError(
            f"{path} does not match its config.json: {problem}. Export the config saved with these weights."
        )
