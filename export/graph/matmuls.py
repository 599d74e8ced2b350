"""x @ W for each weight recipe, W [in, out] (GPT-2's Conv1D layout; the Llama family packs its projections
into it): float32, int8 (8-bit blocks of INT8_BLOCK inputs, MatMulNBits), int8-rows (7-bit weights per output,
each row of activations quantized by its own largest value, MatMulIntegerToFloat), int8-dynamic (per output
channel, DynamicQuantizeMatMul) and int4 (blocks along the input, export/int4.py). The bias, where there is one,
is added by the op that follows. `matmul_nbits` writes the one MatMulNBits node both block recipes use, at 4 or 8
bits; `quantize_rows` the per-row activations of int8-rows' products and of the int8 recipes' LM head."""

import numpy as np

from ..int4 import BlockWeight, Int4Options, quantize_blocks
from ..quantize import quantize_int8, quantize_int8_blocks
from .builder import MS_DOMAIN


def nbits_weights(g, w: BlockWeight, name: str) -> list:
    """The BlockWeight w's MatMulNBits initializers: name + "_int{bits}" [N, nb, B * bits / 8], "_scale" [N, nb]
    and, for an asymmetric method, "_zero_point" (none: the op's default 2^(bits-1))."""
    names = [g.weight(f"{name}_int{w.bits}", w.packed), g.weight(f"{name}_scale", w.scale)]
    zero_points = w.matmul_zero_points()
    if zero_points is not None:
        names.append(g.weight(f"{name}_zero_point", zero_points))
    return names


def matmul_nbits(g, x, w: BlockWeight, weights: list, outputs=1):
    """The one MatMulNBits node builder: x [..., K] @ the BlockWeight w ([N, K] in blocks, stored as `weights`,
    nbits_weights) -> [..., N], at w's bits and block size. accuracy_level 4 quantizes x to int8 per row and block
    of inputs, so each row's result depends on that row alone; at accuracy_level 0 (float32 activations) the
    products are ~3x slower."""
    n, _, block_size = w.codes.shape
    attributes = dict(K=w.width, N=n, bits=w.bits, block_size=block_size, accuracy_level=4)
    return g.op("MatMulNBits", [x, *weights], outputs=outputs, domain=MS_DOMAIN, **attributes)


# Each: (g, x [B, T, in], weights {name: array}, prefix[, int4 options]) -> x @ weights[prefix + ".weight"].
def float_matmul(g, x, weights, prefix, int4=None):
    """x @ W, W [in, out] as the checkpoint's float32 array (no copy)."""
    return g.op("MatMul", [x, g.weight(prefix + ".weight", weights[prefix + ".weight"])])


def int8_block_matmul(g, x, weights, prefix, int4=None):
    """x @ W with W in 8-bit blocks; activations quantized per row and block: the result is batch-invariant."""
    weight = weights[prefix + ".weight"]  # [K, N]
    w = quantize_int8_blocks(np.ascontiguousarray(weight.T))
    return matmul_nbits(g, x, w, nbits_weights(g, w, prefix + ".weight"))


def quantize_rows(g, x):
    """x [..., K] -> ((uint8 codes, scale, zero point), largest [..., 1]): each row divided by its own largest
    |value| (at least 1e-30: a row of zeros stays zeros) and quantized with the fixed scale 1/127, zero point 128.
    A product of the codes, multiplied by `largest` after, gives that row's result from that row alone: no
    scale spans the rows of a batch or the positions of a prompt."""
    largest = g.op("Max", [g.op("ReduceMax", [g.op("Abs", [x])], axes=[-1]), g.const(1e-30, np.float32)])
    fixed = [g.const(1 / 127, np.float32), g.const(128, np.uint8)]
    return [g.op("QuantizeLinear", [g.op("Div", [x, largest]), *fixed]), *fixed], largest


def int8_row_matmul(g, x, weights, prefix, int4=None):
    """x @ W with W int8 per output column (7 bits: export/quantize.py) and x quantized row by row
    (quantize_rows): onnxruntime's packed integer GEMM, which reads each packed weight once for every row of a
    batch or prompt, and whose int32 sums make a row's result the same whichever rows are beside it."""
    name = prefix + ".weight"
    w = quantize_int8(weights[name])  # [K, N]
    (codes, code_scale, code_zero), largest = quantize_rows(g, x)
    stored = [g.weight(f"{name}_int8", w.q), g.weight(f"{name}_scale", w.scale)]
    stored.append(g.weight(f"{name}_zero_point", np.zeros_like(w.scale, dtype=np.int8)))
    inputs = [codes, stored[0], code_scale, stored[1], code_zero, stored[2]]
    return g.op("Mul", [g.op("MatMulIntegerToFloat", inputs, domain=MS_DOMAIN), largest])


def int8_dynamic_matmul(g, x, weights, prefix, int4=None):
    """The same product with int8 weights per output channel; onnxruntime quantizes the activations on the fly,
    with one scale for the whole [B, T, in] tensor."""
    w = quantize_int8(weights[prefix + ".weight"])
    scale = g.weight(prefix + ".weight_scale", w.scale)
    zero_point = g.weight(prefix + ".weight_zero_point", np.zeros_like(w.scale, dtype=np.int8))
    return g.op(
        "DynamicQuantizeMatMul", [x, g.weight(prefix + ".weight_int8", w.q), scale, zero_point], domain=MS_DOMAIN
    )


def int4_matmul(g, x, weights, prefix, int4: Int4Options | None = None):
    """x @ W with W in 4-bit blocks, rounded by the options' method (gptq with the product's Hessian)."""
    int4 = int4 or Int4Options()
    name = prefix + ".weight"
    hessian = (int4.hessians or {}).get(name) if int4.method == "gptq" else None
    w = quantize_blocks(np.ascontiguousarray(weights[name].T), int4.block_size, int4.method, 4, hessian)
    return matmul_nbits(g, x, w, nbits_weights(g, w, name))


MATMULS = {
    "none": float_matmul,
    "int8": int8_block_matmul,
    "int8-rows": int8_row_matmul,
    "int8-dynamic": int8_dynamic_matmul,
    "int4": int4_matmul,
}  # recipe -> its product
