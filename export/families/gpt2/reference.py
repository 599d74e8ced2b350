"""The GPT-2 family's PyTorch reference (transformers' GPT2LMHeadModel, float32, eager attention), which the
export is validated against, and the int8 cache's calibration on it (both the way every family builds and
calibrates: export/reference.py, export/calibrate.py)."""

from ...calibrate import cache_scales, calibration_rows
from ...reference import build_reference

REFERENCE_CLASS = "GPT2LMHeadModel"


def reference_model(checkpoint):
    """The same weights in transformers' GPT2LMHeadModel: the fidelity reference, with its causal-mask buffers
    (which are not weights) filled."""
    return build_reference(checkpoint, REFERENCE_CLASS, ignored_missing=(".attn.bias",), buffers=_causal_masks)


def _causal_masks(model, arch) -> None:
    import torch

    n = arch.n_positions
    causal = torch.tril(torch.ones((n, n), dtype=torch.bool)).view(1, 1, n, n)
    for block in model.transformer.h:
        block.attn.bias = causal
        block.attn.masked_bias = torch.tensor(-1e4)


def kv_cache_scales(model, tokenizer, arch) -> dict:
    """layer -> (key scale, value scale), float32 [n_head, head_size] each, from c_attn's output: [B, T, 3C]
    packed as q | k | v."""
    C, H, D = arch.n_embd, arch.n_head, arch.head_size

    def keys_and_values(output):  # -> [2, H, D]
        return output[0, :, C:].abs().reshape(-1, 2, H, D).amax(dim=0)

    taps = [(i, slice(0, 2), block.attn.c_attn, keys_and_values) for i, block in enumerate(model.transformer.h)]
    return cache_scales(model, calibration_rows(tokenizer, arch), taps, arch)
