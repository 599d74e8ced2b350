"""The GPT-2 family's weights: model.safetensors, or pytorch_model.bin through torch's weights-only loader, as
float32 arrays under GPT2LMHeadModel's names, checked against the config (GPT-2's Conv1D weights are [in, out])."""

from pathlib import Path

import numpy as np
from edgelm.runtime.package.format import Architecture

from ...checkpoint import check_finite, tensors, transposed
from ...errors import ExportError
from .activations import WEIGHTS as ACTIVATION_WEIGHTS

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


def read_weights(folder: Path, arch: Architecture) -> tuple[dict[str, np.ndarray], str]:
    """Safetensors first; a PyTorch .bin only through torch's weights-only loader (never arbitrary unpickling)."""
    import torch

    for name in WEIGHT_FILES:
        path = folder / name
        if path.exists():
            break
    else:
        raise ExportError(f"{folder} has no weights: expected one of {', '.join(WEIGHT_FILES)}.")
    weights = {}
    for key, tensor in tensors(path):  # converted one by one: a float16 checkpoint is never held twice
        if key.endswith((".attn.bias", ".attn.masked_bias")):
            continue  # causal-mask buffers of old checkpoints, not weights
        key = key if key.startswith(("transformer.", "lm_head.")) else "transformer." + key
        if key == "transformer.wte.weight" and arch.tie_word_embeddings and tensor.ndim == 2:
            weights[key] = transposed(tensor)  # the LM head multiplies by its transpose: stored that way, once
        else:
            weights[key] = tensor.detach().to(torch.float32).numpy()
        check_finite(key, weights[key], path)
    _check_weights(weights, arch, path)
    if arch.tie_word_embeddings:
        weights.pop("lm_head.weight", None)  # the same matrix as the embedding (checked): not held twice
    return weights, name


def _check_weights(weights: dict, arch: Architecture, path: Path) -> None:
    """Every tensor the graph reads, in the shape the config promises (GPT-2's Conv1D weights are [in, out])."""
    C, V, inner = arch.n_embd, arch.vocab_size, arch.mlp_width
    expected = {
        "transformer.wte.weight": (V, C),
        "transformer.wpe.weight": (arch.n_positions, C),
        "transformer.ln_f.weight": (C,),
        "transformer.ln_f.bias": (C,),
    }
    if not arch.tie_word_embeddings:
        expected["lm_head.weight"] = (V, C)
    act = ACTIVATION_WEIGHTS.get(arch.activation_function, ())
    for i in range(arch.n_layer):
        p = f"transformer.h.{i}."
        for norm in ("ln_1", "ln_2"):
            expected |= {f"{p}{norm}.weight": (C,), f"{p}{norm}.bias": (C,)}
        expected |= {p + "attn.c_attn.weight": (C, 3 * C), p + "attn.c_attn.bias": (3 * C,)}
        expected |= {p + "attn.c_proj.weight": (C, C), p + "attn.c_proj.bias": (C,)}
        expected |= {p + "mlp.c_fc.weight": (C, inner), p + "mlp.c_fc.bias": (inner,)}
        expected |= {p + "mlp.c_proj.weight": (inner, C), p + "mlp.c_proj.bias": (C,)}
        expected |= {f"{p}mlp.act.{name}": None for name in act}  # prelu / xielu's own parameters
    missing = [k for k in expected if k not in weights]
    if missing:
        untied = "lm_head.weight" in missing
        raise ExportError(
            f"{path} is missing {len(missing)} weight tensors the config promises (first: "
            f"{'lm_head.weight, which tie_word_embeddings false needs' if untied else missing[0]}); the checkpoint is incomplete."
        )
    wrong = [f"{k} {weights[k].shape} != {s}" for k, s in expected.items() if s and weights[k].shape != s]
    if wrong:
        raise ExportError(f"{path} does not match its config.json: {wrong[0]}.")
    head = weights.get("lm_head.weight")
    if arch.tie_word_embeddings and head is not None and not np.array_equal(head, weights["transformer.wte.weight"]):
        raise ExportError(
            f"{path} holds an lm_head.weight that differs from the token embedding, but its config.json ties them "
            "(tie_word_embeddings is true or unset), so transformers would ignore that head. Set "
            '"tie_word_embeddings": false in config.json to export the separate head.'
        )
