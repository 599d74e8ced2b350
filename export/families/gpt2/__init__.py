"""The GPT-2 family (model_type 'gpt2'): learned positions, LayerNorm, GPT-2's activations, Conv1D weights."""

from ..family import Family
from .config import read_config
from .graph import build_decoder
from .reference import REFERENCE_CLASS, kv_cache_scales, reference_model
from .weights import read_weights

GPT2 = Family(
    name="gpt2",
    reference_classes={"gpt2": REFERENCE_CLASS},
    described="GPT-2-family checkpoints (model_type 'gpt2': gpt2, distilgpt2, gpt2-medium/large/xl and their fine-tunes)",
    read_config=read_config,
    read_weights=read_weights,
    build_decoder=build_decoder,
    reference_model=reference_model,
    kv_cache_scales=kv_cache_scales,
)
