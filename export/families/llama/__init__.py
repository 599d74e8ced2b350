"""The Llama family (model_type 'llama' and 'qwen2'): rotary positions, RMSNorm, grouped-query attention and a
SwiGLU MLP; Qwen2 is the same graph with biases on Q, K and V."""

from ..family import Family
from .config import REFERENCE, read_config
from .graph import build_decoder
from .reference import kv_cache_scales, reference_model
from .weights import read_weights

LLAMA = Family(
    name="llama",
    reference_classes=REFERENCE,
    described="Llama (model_type 'llama': LlamaForCausalLM, e.g. Llama 3.2, TinyLlama, SmolLM2) and Qwen2 "
    "(model_type 'qwen2': Qwen2ForCausalLM, e.g. Qwen2.5)",
    read_config=read_config,
    read_weights=read_weights,
    build_decoder=build_decoder,
    reference_model=reference_model,
    kv_cache_scales=kv_cache_scales,
)
