"""The Llama family's PyTorch reference (transformers' LlamaForCausalLM / Qwen2ForCausalLM, float32, eager
attention), which the export is validated against, and the int8 cache's calibration on it."""

from dataclasses import replace

import numpy as np
from edgelm.runtime.package.format import Architecture

from ...calibrate import calibration_rows, channel_scales
from ...errors import ExportError
from .config import REFERENCE

CALIBRATION_POSITIONS = 1024  # rotary keys' size does not depend on the position: rows this long cover them


def reference_model(checkpoint):
    """The same weights in transformers' LlamaForCausalLM / Qwen2ForCausalLM (float32, eager attention). Built on
    the meta device and given the checkpoint's own arrays (no random initialization, no second copy of the
    weights: a 1B model's are 5 GB); only the rotary tables, computed at construction, are built for real."""
    import torch
    import transformers

    name = REFERENCE[checkpoint.arch.model_type]
    config_class = getattr(transformers, name.replace("ForCausalLM", "Config"))
    try:
        config = config_class.from_dict(checkpoint.config)
        config._attn_implementation = "eager"
        with torch.device("meta"):
            model = getattr(transformers, name)(config).eval()
        model.model.rotary_emb = type(model.model.rotary_emb)(config=config)
    except (TypeError, ValueError, AttributeError, KeyError) as error:  # a setting transformers cannot take
        raise ExportError(
            f"transformers cannot build {name} from {checkpoint.folder / 'config.json'} "
            f"({type(error).__name__}: {str(error)[:200]}); fix or remove that setting."
        ) from None
    state = {k: torch.from_numpy(v) for k, v in checkpoint.weights.items()}
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    missing = [k for k in missing if k != "lm_head.weight"]
    if missing or unexpected:
        raise ExportError(f"the weights do not fit {name}: missing {missing[:3]}, unexpected {unexpected[:3]}.")
    if checkpoint.arch.tie_word_embeddings:
        model.tie_weights()
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.device.type == "meta"]
    if left:
        raise ExportError(f"the weights do not fit {name}: {left[0]} was not given; the checkpoint is incomplete.")
    return model


def kv_cache_scales(model, tokenizer, arch: Architecture) -> dict:
    """layer -> (key scale, value scale), float32 [kv_heads, head_size] each, for an int8 cache.

    The cache holds keys after the rotation, which mixes channel j with channel j + D/2 at an angle that
    depends on the position: the key scale of both is the largest length of that pair seen (any rotation
    of the pair stays within it), so the scales hold at every position."""
    import torch

    KV, D = arch.kv_heads, arch.head_size
    absmax = [np.zeros((2, KV, D), dtype=np.float32) for _ in range(arch.n_layer)]

    def record(layer, kind):
        def hook(_module, _inputs, output):  # [B, T, KV * D]
            values = output[0].detach().float().reshape(-1, KV, D)
            if kind == 0:  # the pair's length, for both of its channels
                length = values[..., : D // 2].square().add(values[..., D // 2 :].square()).sqrt()
                values = torch.cat([length, length], dim=-1)
            np.maximum(absmax[layer][kind], values.abs().amax(dim=0).numpy(), out=absmax[layer][kind])

        return hook

    short = replace(arch, n_positions=min(arch.n_positions, CALIBRATION_POSITIONS))
    hooks = []
    for i, layer in enumerate(model.model.layers):
        hooks.append(layer.self_attn.k_proj.register_forward_hook(record(i, 0)))
        hooks.append(layer.self_attn.v_proj.register_forward_hook(record(i, 1)))
    try:
        with torch.no_grad():
            for row in calibration_rows(tokenizer, short):
                model(input_ids=torch.tensor([row]))
    finally:
        for h in hooks:
            h.remove()
    return {i: (channel_scales(a[0]), channel_scales(a[1])) for i, a in enumerate(absmax)}
