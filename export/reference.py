"""The PyTorch reference every family is validated against, built one way: transformers' own class for the
checkpoint's model_type (float32, eager attention), built on the meta device and given the checkpoint's arrays
(no random initialization, no second copy of the weights: gpt2-xl's are 6 GB, a 1B Llama's 5 GB). A family says
only what differs: which class, what to build for real, which buffers to fill (families/*/reference.py)."""

from typing import Callable

from .errors import ExportError


def build_reference(
    checkpoint,
    class_name: str,
    built: Callable | None = None,
    ignored_missing: tuple = (),
    buffers: Callable | None = None,
):
    """transformers' `class_name` with the checkpoint's weights. built(model, config), on the meta-device model:
    what must be computed for real at construction (a rotary table); ignored_missing: suffixes of state names the
    checkpoint need not give (buffers that `buffers(model, arch)` fills after the weights are in). A parameter
    transformers keeps in another dtype gets that dtype, as loading would give it. ExportError for a config
    transformers cannot take and for weights that do not fit."""
    import torch
    import transformers
    from transformers.utils import logging as hf_logging

    model_class = getattr(transformers, class_name)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # some modules log notes (xielu's about CUDA kernels); the library never prints
    try:
        config = model_class.config_class.from_dict(checkpoint.config)
        config._attn_implementation = "eager"
        with torch.device("meta"):
            model = model_class(config).eval()
        if built is not None:
            built(model, config)
    except (TypeError, ValueError, AttributeError, KeyError) as error:  # a setting transformers cannot take
        raise ExportError(
            f"transformers cannot build {class_name} from {checkpoint.folder / 'config.json'} "
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
    missing = [k for k in missing if k != "lm_head.weight" and not (ignored_missing and k.endswith(ignored_missing))]
    if missing or unexpected:
        raise ExportError(
            f"the weights do not fit {class_name}: missing {missing[:3]}, unexpected {unexpected[:3]}."
        )
    if checkpoint.arch.tie_word_embeddings:
        model.tie_weights()
    if buffers is not None:
        buffers(model, checkpoint.arch)
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.device.type == "meta"]
    if left:
        raise ExportError(
            f"the weights do not fit {class_name}: {left[0]} was not given; the checkpoint is incomplete."
        )
    return model
