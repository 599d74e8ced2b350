"""Weight quantization recipes, applied to NumPy arrays before they enter the graph.

int8 (the default 8-bit recipe) stores each product's weights in 8 bits, one scale per block of INT8_BLOCK
inputs of each output, for onnxruntime's MatMulNBits (bits 8, accuracy_level 4), which quantizes activations
per row and block too: a row's output depends on that row alone, so a greedy request gives the same tokens
alone and in a batch, and a long prompt's outliers do not coarsen the other positions' steps.

int8-dynamic is symmetric and per output channel: each column n of a [K, N] weight gets its own scale, so one
outlier column does not cost the others their precision, and DynamicQuantizeMatMul quantizes activations with
one scale per tensor (every row of the batch and every position of the prompt together). Weights use 7 bits
([-64, 63]) by default. Why: onnxruntime's dynamic-quantization kernels multiply uint8 activations by int8 weights, and on x86
CPUs without VNNI (AVX2 only, like this project's machines) they use VPMADDUBSW, which adds two u8*s8
products into a saturating int16. With full-range weights 2 * 255 * 127 = 64,770 overflows 32,767 and
results silently saturate; with 7-bit weights 2 * 255 * 64 = 32,640 cannot. onnxruntime's own
quantize_dynamic calls this `reduce_range`. The lost bit is measured by the export's quality report.
"""

from dataclasses import dataclass

import numpy as np

RECIPES = ("none", "int8", "int8-dynamic", "int4")
INT8_RECIPES = ("int8", "int8-dynamic")  # the recipes whose weights are int8 (the manifest's weights.dtype "int8")
INT4_BLOCK = 32  # weights per scale along the input dimension (llama.cpp q4_0 uses 32 too)
INT8_BLOCK = 32  # the int8 recipe's inputs per scale (64: the same quality on trained checkpoints, benchmarks/NOTES.md)


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


@dataclass(frozen=True)
class Int4Weight:
    """A logical [K, N] weight stored as onnxruntime's MatMulNBits expects: transposed, 4-bit, in blocks."""

    packed: np.ndarray  # uint8 [N, K / 32, 16]: two 4-bit values per byte, low nibble first
    scale: np.ndarray  # float32 [N, K / 32]: w ~= (q - 8) * scale


def quantize_int4(weight_nk: np.ndarray) -> Int4Weight:
    """Symmetric 4-bit, one scale per block of 32 inputs, zero point 8 (the ops' default); weight_nk is [N, K]."""
    n, k = weight_nk.shape
    if k % INT4_BLOCK:
        raise ValueError(f"int4 needs input widths divisible by {INT4_BLOCK}, got {k}")
    blocks = weight_nk.reshape(n, k // INT4_BLOCK, INT4_BLOCK)
    absmax = np.abs(blocks).max(axis=-1)
    scale = np.where(absmax > 0, absmax / 7, 1.0).astype(np.float32)
    q = (np.clip(np.rint(blocks / scale[..., None]), -8, 7) + 8).astype(np.uint8)
    return Int4Weight(packed=q[..., 0::2] | (q[..., 1::2] << 4), scale=scale)


@dataclass(frozen=True)
class BlockWeight:
    """A logical [K, N] weight as MatMulNBits stores it: transposed, in blocks of `block` inputs, unsigned with the
    zero point 2 ** (bits - 1) (the op's default); K is padded with zeros to whole blocks."""

    packed: np.ndarray  # uint8 [N, ceil(K / block), block * bits / 8]
    scale: np.ndarray  # float32 [N, ceil(K / block)]: w ~= (q - 2 ** (bits - 1)) * scale
    bits: int
    block: int


def quantize_int8_blocks(weight_nk: np.ndarray, block: int = INT8_BLOCK) -> BlockWeight:
    """Symmetric 8-bit ([-127, 127], stored + 128), one scale per block of `block` inputs; weight_nk is [N, K]."""
    n, k = weight_nk.shape
    padded = np.zeros((n, -(-k // block) * block), dtype=np.float32)
    padded[:, :k] = weight_nk
    blocks = padded.reshape(n, -1, block)
    absmax = np.abs(blocks).max(axis=-1)
    scale = np.where(absmax > 0, absmax / 127, 1.0).astype(np.float32)
    q = (np.clip(np.rint(blocks / scale[..., None]), -127, 127) + 128).astype(np.uint8)
    return BlockWeight(packed=q, scale=scale, bits=8, block=block)


def recipe_description(recipe: str, reduce_range: bool = True, tied: bool = True) -> dict:
    """What the manifest records about how the weights were stored."""
    covers = (
        "every block MatMul and the tied embedding / LM head matrix (stored once)"
        if tied
        else "every block MatMul, the token embedding and the LM head (each its own matrix)"
    )
    if recipe == "none":
        return {"method": "none", "weights": "float32"}
    if recipe == "int4":
        return {
            "method": "int4",
            "weights": f"4-bit, symmetric, one float32 scale per block of {INT4_BLOCK} inputs, zero point 8",
            "bits": 4,
            "block_size": INT4_BLOCK,
            "ops": "MatMulNBits (accuracy_level 4: int8 activations) and GatherBlockQuantized for the token lookup",
            "covers": covers,
            "kept_float32": "position table, biases, layer norms",
        }
    if recipe == "int8":
        return {
            "method": "int8",
            "weights": f"int8, symmetric, one float32 scale per block of {INT8_BLOCK} inputs (stored + 128)",
            "bits": 8,
            "block_size": INT8_BLOCK,
            "activations": "int8, per row and block of inputs (onnxruntime MatMulNBits accuracy_level 4)",
            "ops": (
                "MatMulNBits bits 8 for every block product; the LM head QGemm over the token rows (one scale per "
                "vocabulary entry), each row's activations scaled by its own largest value"
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
        "covers": covers,
        "kept_float32": "position table, biases, layer norms",
        "why_reduce_range": "u8s8 VPMADDUBSW saturates int16 on x86 without VNNI; 7-bit weights cannot",
        "batch_invariant": False,
    }
