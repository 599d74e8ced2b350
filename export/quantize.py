"""Weight quantization recipes, applied to NumPy arrays before they enter the graph.

int8 (the default 8-bit recipe) stores each product's weights in 8 bits, one scale per block of INT8_BLOCK
inputs of each output (int8_block: 32 for a product whose inputs 64 does not divide), for onnxruntime's
MatMulNBits (bits 8, accuracy_level 4), which quantizes activations per row and block too: a row's output
depends on that row alone, so a greedy request gives the same tokens alone and in a batch, and a long prompt's
outliers do not coarsen the other positions' steps.

int8-rows stores each product's weights as int8 per output column (7 bits, below) and quantizes activations row
by row: each row of a product's input is divided by its own largest |value| and rounded to 8 bits
(export/graph/matmuls.py quantize_rows), and onnxruntime's packed integer GEMM (MatMulIntegerToFloat; QGemm for the
LM head, as int8's) multiplies them. Its int32 sums are exact, so a row's output depends on that row alone, as
int8's, and the packed weights are read once for all the rows of a batch or a prompt, which MatMulNBits does row
by row: a long prompt's first token comes sooner and a batch decodes faster, at a slower one-row step (the
figures are in docs/export.md).

int8-dynamic is symmetric and per output channel: each column n of a [K, N] weight gets its own scale, so one
outlier column does not cost the others their precision, and DynamicQuantizeMatMul quantizes activations with
one scale per tensor (every row of the batch and every position of the prompt together). Weights use 7 bits
([-64, 63]) by default, as int8-rows' do. Why: onnxruntime's integer kernels multiply uint8 activations by int8
weights, and on x86 CPUs without VNNI (AVX2 only) they use VPMADDUBSW, which adds two u8*s8
products into a saturating int16. With full-range weights 2 * 255 * 127 = 64,770 overflows 32,767 and
results silently saturate; with 7-bit weights 2 * 255 * 64 = 32,640 cannot. onnxruntime's own
quantize_dynamic calls this `reduce_range`. The lost bit is measured by the export's quality report.

int4 (blocks along the input, its options and rounding methods) and the block layout both share live in
export/int4.py.
"""

from dataclasses import dataclass

import numpy as np

from .int4 import BlockWeight, Int4Options, quantize_blocks

RECIPES = ("none", "int8", "int8-rows", "int8-dynamic", "int4")
INT8_RECIPES = ("int8", "int8-rows", "int8-dynamic")  # the recipes whose weights are int8 (weights.dtype "int8")
INT8_BLOCK = 64  # the int8 recipe's inputs per scale and per activation block, where a product's inputs divide by it


@dataclass(frozen=True)
class Int8Weight:
    """A [K, N] weight as int8 values and one float scale per column: w ~= q * scale."""

    q: np.ndarray  # int8 [K, N]
    scale: np.ndarray  # float32 [N]


def quantize_int8(weight: np.ndarray, reduce_range: bool = True) -> Int8Weight:
    """Quantize a [K, N] float weight per column, symmetric (zero point 0)."""
    qmax = 63 if reduce_range else 127
    absmax = np.abs(weight).max(axis=0)
    scale = np.where(absmax > 0, absmax / qmax, 1.0).astype(np.float32)
    q = np.clip(np.rint(weight / scale), -qmax - (1 if reduce_range else 0), qmax).astype(np.int8)
    return Int8Weight(q=q, scale=scale)


def int8_block(width: int) -> int:
    """The int8 recipe's block for a product of `width` inputs: INT8_BLOCK where it divides width, else 32 (the
    last block padded where 32 does not divide it either). Why 64: onnxruntime's 8-bit kernel pays per block, and
    a step in blocks of 64 is faster than in 32; in blocks of 128 it is faster still, but there its many-row path
    sums in another order than its one-row path, so a row's logits would depend on how many rows a pass has (a
    batch, a verify pass): at 32 and 64 they are the same bits (tests/export/test_int8_recipes.py)."""
    return INT8_BLOCK if width % INT8_BLOCK == 0 else 32


def quantize_int8_blocks(weight_nk: np.ndarray, block: int | None = None) -> BlockWeight:
    """Symmetric 8-bit ([-127, 127], stored + 128), one scale per block of `block` inputs (int8_block of K by
    default), K padded with zeros to whole blocks; weight_nk is [N, K]. The int4 recipe's plain rounding at 8 bits
    (export/int4.py)."""
    return quantize_blocks(weight_nk, block or int8_block(weight_nk.shape[1]), "rtn", 8)


def recipe_description(recipe: str, reduce_range: bool = True, tied: bool = True, int4=None) -> dict:
    """What the manifest records about how the weights were stored; int4: the int4 recipe's Int4Options."""
    covers = (
        "every block MatMul and the tied embedding / LM head matrix (stored once)"
        if tied
        else "every block MatMul, the token embedding and the LM head (each its own matrix)"
    )
    if recipe == "none":
        return {"method": "none", "weights": "float32"}
    if recipe == "int4":
        int4 = int4 or Int4Options()
        zero_point = {"kquant": "a 4-bit zero point", "hqq": "a float32 zero point"}.get(int4.method, "zero point 8")
        head = "" if int4.head_bits == 4 else "; the LM head and token table 8-bit, zero point 128"
        return {
            "method": "int4",
            "weights": f"4-bit, {int4.method}, one float32 scale and {zero_point} per block of {int4.block_size} "
            f"inputs{head}",
            "bits": 4,
            **int4.describe(),
            "ops": "MatMulNBits (accuracy_level 4: int8 activations) and GatherBlockQuantized for the token lookup",
            "covers": covers,
            "kept_float32": "position table, biases, layer norms",
        }
    if recipe == "int8":
        return {
            "method": "int8",
            "weights": f"int8, symmetric, one float32 scale per block of {INT8_BLOCK} inputs, or of 32 where a "
            f"product's inputs are not a multiple of {INT8_BLOCK} (stored + 128)",
            "bits": 8,
            "block_size": INT8_BLOCK,
            "activations": "int8, per row and block of inputs (onnxruntime MatMulNBits accuracy_level 4)",
            "ops": (
                "MatMulNBits bits 8 for every block product and the LM head (tied: over the token table's blocks, "
                "which the runtime reads for the lookup; untied: over the head's own blocks; a tied head whose width "
                "32 does not divide: QGemm over 7-bit rows, each row's activations scaled by its own largest value)"
            ),
            "batch_invariant": True,
            "covers": covers,
            "kept_float32": "position table, biases, layer norms",
        }
    if recipe == "int8-rows":
        return {
            "method": "int8-rows",
            "weights": "int8, symmetric, one float32 scale per output channel",
            "bits": 7 if reduce_range else 8,
            "reduce_range": reduce_range,
            "activations": "uint8, per row: each row divided by its own largest |value|, fixed scale 1/127",
            "ops": (
                "MatMulIntegerToFloat for every block product; the LM head QGemm over the token rows, or an untied "
                "head's own (one scale per vocabulary entry); each row's result multiplied back by its largest value"
            ),
            "batch_invariant": True,
            "covers": covers,
            "kept_float32": "position table, biases, layer norms",
        }
    return {
        "method": "int8-dynamic",
        "weights": "int8, symmetric, per output channel",
        "bits": 7 if reduce_range else 8,
        "reduce_range": reduce_range,
        "activations": "uint8, dynamic per tensor (onnxruntime DynamicQuantizeMatMul)",
        "ops": (
            "DynamicQuantizeMatMul for every block product; the LM head QGemm over the token rows, or an untied "
            "head's own, after DynamicQuantizeLinear (one scale for the whole pass)"
        ),
        "covers": covers,
        "kept_float32": "position table, biases, layer norms",
        "why_reduce_range": "u8s8 VPMADDUBSW saturates int16 on x86 without VNNI; 7-bit weights cannot",
        "batch_invariant": False,
    }
