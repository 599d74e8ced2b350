"""x @ W for each weight recipe, W [in, out] (GPT-2's Conv1D layout; the Llama family packs its projections
into it): float32, int8 (8-bit blocks of INT8_BLOCK inputs, MatMulNBits), int8-dynamic (per output channel,
DynamicQuantizeMatMul) and int4 (blocks of INT4_BLOCK inputs). The bias, where there is one, is added by the op
that follows."""

import numpy as np

from ..quantize import INT4_BLOCK, BlockWeight, quantize_int4, quantize_int8, quantize_int8_blocks
from .builder import MS_DOMAIN


def nbits_matmul(g, x, packed: str, scale: str, k: int, n: int, bits: int, block: int, outputs=1):
    """The one MatMulNBits node builder: x [..., K] @ W -> [..., N], W stored [N, blocks, block * bits / 8] under the
    initializer `packed`, its float32 scales [N, blocks] under `scale`, zero point 2 ** (bits - 1) (the op's
    default). accuracy_level 4 quantizes x to int8 per row and block of inputs, so each row's result depends on
    that row alone; at accuracy_level 0 (float32 activations) the products are ~3x slower."""
    inputs = [x, packed, scale]
    attrs = dict(K=k, N=n, bits=bits, block_size=block, accuracy_level=4)
    return g.op("MatMulNBits", inputs, outputs=outputs, domain=MS_DOMAIN, **attrs)


def _stored_nbits(g, x, name, w: BlockWeight, k: int):
    packed, scale = g.weight(f"{name}_int{w.bits}", w.packed), g.weight(f"{name}_scale", w.scale)
    return nbits_matmul(g, x, packed, scale, k, w.packed.shape[0], w.bits, w.block)


# Each: (g, x [B, T, in], weights {name: array}, prefix) -> x @ weights[prefix + ".weight"], [B, T, out].
def float_matmul(g, x, weights, prefix):
    """x @ W, W [in, out] as the checkpoint's float32 array (no copy)."""
    return g.op("MatMul", [x, g.weight(prefix + ".weight", weights[prefix + ".weight"])])


def int8_block_matmul(g, x, weights, prefix):
    """x @ W with W in 8-bit blocks; activations quantized per row and block: the result is batch-invariant."""
    weight = weights[prefix + ".weight"]  # [K, N]
    w = quantize_int8_blocks(np.ascontiguousarray(weight.T))
    return _stored_nbits(g, x, prefix + ".weight", w, weight.shape[0])


def int8_dynamic_matmul(g, x, weights, prefix):
    """The same product with int8 weights per output channel; onnxruntime quantizes the activations on the fly,
    with one scale for the whole [B, T, in] tensor."""
    w = quantize_int8(weights[prefix + ".weight"])
    scale = g.weight(prefix + ".weight_scale", w.scale)
    zero_point = g.weight(prefix + ".weight_zero_point", np.zeros_like(w.scale, dtype=np.int8))
    return g.op(
        "DynamicQuantizeMatMul", [x, g.weight(prefix + ".weight_int8", w.q), scale, zero_point], domain=MS_DOMAIN
    )


def int4_matmul(g, x, weights, prefix):
    """x @ W with W in 4-bit blocks; accuracy_level 4 quantizes x to int8 (its default 0 is ~100x slower)."""
    weight = weights[prefix + ".weight"]  # [K, N]
    k = weight.shape[0]
    w = quantize_int4(np.ascontiguousarray(weight.T))
    return _stored_nbits(g, x, prefix + ".weight", BlockWeight(w.packed, w.scale, 4, INT4_BLOCK), k)


MATMULS = {
    "none": float_matmul,
    "int8": int8_block_matmul,
    "int8-dynamic": int8_dynamic_matmul,
    "int4": int4_matmul,
}  # recipe -> its product
