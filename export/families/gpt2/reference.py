"""The GPT-2 family's PyTorch reference (transformers' GPT2LMHeadModel, float32, eager attention), which the
export is validated against, and the int8 cache's calibration on it."""

import numpy as np

from ...calibrate import calibration_rows, channel_scales
from ...errors import ExportError

REFERENCE_CLASS = "GPT2LMHeadModel"


def reference_model(checkpoint):
    """The same weights in transformers' GPT2LMHeadModel: the fidelity reference. Built on the meta device and
    given the checkpoint's arrays (no random initialization, no second copy of the weights: gpt2-xl's are 6 GB);
    a parameter transformers keeps in another dtype (xielu's bfloat16) gets that dtype, as loading would give it."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # xielu's module logs a note about CUDA kernels; the library never prints
    try:
        config = GPT2Config.from_dict(checkpoint.config)
        config._attn_implementation = "eager"
        with torch.device("meta"):
            model = GPT2LMHeadModel(config).eval()
    except (TypeError, ValueError, AttributeError, KeyError) as error:  # a setting transformers cannot take
        raise ExportError(
            f"transformers cannot build GPT2LMHeadModel from {checkpoint.folder / 'config.json'} "
            f"({type(error).__name__}: {str(error)[:200]}); fix or remove that setting."
        ) from None
    finally:
        hf_logging.set_verbosity(verbosity)
    expected = model.state_dict()
    state = {
        k: torch.from_numpy(v).to(expected[k].dtype if k in expected else torch.float32)
        for k, v in checkpoint.weights.items()
    }
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    missing = [k for k in missing if k != "lm_head.weight" and not k.endswith(".attn.bias")]
    if missing or unexpected:
        raise ExportError(
            f"the weights do not fit GPT2LMHeadModel: missing {missing[:3]}, unexpected {unexpected[:3]}."
        )
    model.tie_weights()
    n = checkpoint.arch.n_positions
    causal = torch.tril(torch.ones((n, n), dtype=torch.bool)).view(1, 1, n, n)
    for block in model.transformer.h:  # the causal-mask buffers, which are not weights
        block.attn.bias = causal
        block.attn.masked_bias = torch.tensor(-1e4)
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.device.type == "meta"]
    if left:
        raise ExportError(
            f"the weights do not fit GPT2LMHeadModel: {left[0]} was not given; the checkpoint is incomplete."
        )
    return model


def kv_cache_scales(model, tokenizer, arch) -> dict:
    """layer -> (key scale, value scale), float32 [n_head, head_size] each."""
    import torch

    C, H, D = arch.n_embd, arch.n_head, arch.head_size
    absmax = [np.zeros((2, H, D), dtype=np.float32) for _ in range(arch.n_layer)]

    def record(layer):
        def hook(_module, _inputs, output):  # c_attn's output: [B, T, 3C] packed as q | k | v
            kv = output[0, :, C:].detach().float().abs().reshape(-1, 2, H, D).amax(dim=0).numpy()
            np.maximum(absmax[layer], kv, out=absmax[layer])

        return hook

    rows = calibration_rows(tokenizer, arch)
    hooks = [block.attn.c_attn.register_forward_hook(record(i)) for i, block in enumerate(model.transformer.h)]
    try:
        with torch.no_grad():
            for row in rows:
                model(input_ids=torch.tensor([row]))
    finally:
        for h in hooks:
            h.remove()
    return {i: (channel_scales(a[0]), channel_scales(a[1])) for i, a in enumerate(absmax)}
