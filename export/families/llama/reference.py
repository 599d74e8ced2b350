"""The Llama family's PyTorch reference (transformers' LlamaForCausalLM / Qwen2ForCausalLM, float32, eager
attention), which the export is validated against, and the int8 cache's calibration on it (both the way every
family builds and calibrates: export/reference.py, export/calibrate.py)."""

from dataclasses import replace

from edgelm.runtime.package.format import Architecture

from ...calibrate import cache_scales, calibration_rows
from ...reference import build_reference
from .config import REFERENCE

CALIBRATION_POSITIONS = 1024  # rotary keys' size does not depend on the position: rows this long cover them


def reference_model(checkpoint):
    """The same weights in transformers' LlamaForCausalLM / Qwen2ForCausalLM; only the rotary tables, computed
    at construction, are built for real."""
    return build_reference(checkpoint, REFERENCE[checkpoint.arch.model_type], built=_rotary_tables)


def _rotary_tables(model, config) -> None:
    model.model.rotary_emb = type(model.model.rotary_emb)(config=config)


def kv_cache_scales(model, tokenizer, arch: Architecture) -> dict:
    """layer -> (key scale, value scale), float32 [kv_heads, head_size] each, for an int8 cache.

    The cache holds keys after the rotation, which mixes channel j with channel j + D/2 at an angle that
    depends on the position: the key scale of both is the largest length of that pair seen (any rotation
    of the pair stays within it), so the scales hold at every position."""
    import torch

    KV, D = arch.kv_heads, arch.head_size

    def keys(output):  # k_proj's [B, T, KV * D] -> each pair's length, for both of its channels: [KV, D]
        values = output[0].reshape(-1, KV, D)
        length = values[..., : D // 2].square().add(values[..., D // 2 :].square()).sqrt()
        return torch.cat([length, length], dim=-1).amax(dim=0)

    def values(output):  # v_proj's [B, T, KV * D] -> [KV, D]
        return output[0].reshape(-1, KV, D).abs().amax(dim=0)

    taps = []
    for i, layer in enumerate(model.model.layers):
        taps += [(i, 0, layer.self_attn.k_proj, keys), (i, 1, layer.self_attn.v_proj, values)]
    short = replace(arch, n_positions=min(arch.n_positions, CALIBRATION_POSITIONS))
    return cache_scales(model, calibration_rows(tokenizer, short), taps, arch)
