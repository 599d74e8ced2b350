"""x @ W for each weight recipe, W [in, out] (GPT-2's Conv1D layout; the Llama family packs its projections
into it): float32, int8 (per output channel) and int4 (blocks of INT4_BLOCK inputs). The bias, where there is
one, is added by the op that follows."""

import numpy as np

from ..quantize import INT4_BLOCK, quantize_int4, quantize_int8
from .builder import MS_DOMAIN


# Each: (g, x [B, T, in], weights {name: array}, prefix) -> x @ weights[prefix + ".weight"], [B, T, out].
def float_matmul(g, x, weights, prefix):
    """x @ W, W [in, out] as the checkpoint's float32 array (no copy)."""
    return g.op("MatMul", [x, g.weight(prefix + ".weight", weights[prefix + ".weight"])])


def int8_matmul(g, x, weights, prefix):
    """The same product with int8 weights; activations are quantized on the fly by onnxruntime."""
    w = quantize_int8(weights[prefix + ".weight"])
    scale = g.weight(prefix + ".weight_scale", w.scale)
    zero_point = g.weight(prefix + ".weight_zero_point", np.zeros_like(w.scale, dtype=np.int8))
    return g.op(
        "DynamicQuantizeMatMul", [x, g.weight(prefix + ".weight_int8", w.q), scale, zero_point], domain=MS_DOMAIN
    )


def int4_matmul(g, x, weights, prefix):
    """x @ W with W in 4-bit blocks; accuracy_level 4 quantizes x to int8 (its default 0 is ~100x slower)."""
    weight = weights[prefix + ".weight"]  # [K, N]
    w = quantize_int4(np.ascontiguousarray(weight.T))
    k, n = weight.shape
    inputs = [x, g.weight(prefix + ".weight_int4", w.packed), g.weight(prefix + ".weight_scale", w.scale)]
    return g.op("MatMulNBits", inputs, domain=MS_DOMAIN, K=k, N=n, bits=4, block_size=INT4_BLOCK, accuracy_level=4)


MATMULS = {"none": float_matmul, "int8": int8_matmul, "int4": int4_matmul}  # recipe -> its product
