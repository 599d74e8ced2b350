"""The int4 recipe's options and its block quantizers, on NumPy arrays before they enter the graph.

A weight is stored as onnxruntime's MatMulNBits and GatherBlockQuantized read it: [N, K] (output by input), cut
along K into blocks of `block_size`, each block with one float32 scale and, for the asymmetric methods, a zero
point: w ~= (code - zero_point) * scale, codes 0..2^bits - 1. A width K that is not a multiple of the block is
padded with zeros to the next one: MatMulNBits defines its blocks as ceil(K / block_size) with the tail padded
(onnxruntime's own quantizer pads the same way), and the token lookup drops the padding after its gather.

The methods (`METHODS`), each a function (blocks [M, B] float32, bits) -> (codes, scale, zero point):
  rtn     symmetric round to nearest, scale = absmax / (2^(bits-1) - 1), zero point 2^(bits-1) implied.
  clip    symmetric, each block's scale chosen among CLIP_STEPS shrunk absmax candidates (1 down to CLIP_MIN
          times absmax) to minimise the block's squared error; the first candidate is rtn's, so a block is never
          worse than rtn. (GPTQ's and AWQ's clipping searches do the same per group.) rtn and clip are written
          in export/rounding.py, which gptq shares.
  kquant  asymmetric, llama.cpp's k-quant search (onnxruntime's quant_tensor_k_quant_cpu, called as it is).
  hqq     asymmetric, Half-Quadratic Quantization (Badri & Shaji 2023): onnxruntime's HQQ quantize_internal, in
          torch; its zero points are float.
  gptq    GPTQ (Frantar et al. 2022, export/gptq.py): clip's blocks, each column's rounding error spread over the
          columns not yet rounded through the inverse Hessian of calibration activations.
The token table that GatherBlockQuantized reads takes clip for hqq (that op reads integer zero points only) and
gptq (the lookup has no activations to calibrate on); an 8-bit head and table (`head_bits` 8) take rtn: at
8 bits plain rounding is already within float noise of float32.
"""

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from .errors import ExportError
from .rounding import block_error, clip, rtn  # noqa: F401 (block_error: callers measure a method's blocks here)

BLOCK_SIZES = (16, 32, 64, 128)  # MatMulNBits takes powers of two from 16
METHODS = ("rtn", "clip", "kquant", "hqq", "gptq")
HEAD_BITS = (4, 8)
ASYMMETRIC = ("kquant", "hqq")  # the methods that store a zero point per block


@dataclass(frozen=True)
class Int4Options:
    """How `--quantize int4` stores the weights; checked once, here (ExportError with the valid choices)."""

    # weights per scale along the input dimension. 128, the group size of GPTQ and AWQ checkpoints: a decode step
    # 1.2-1.35x faster than at 32 with fewer bytes, within the quality target on both trained test models
    # (benchmarks/results/2026-12-06-int4-block.md)
    block_size: int = 128
    # one of METHODS (module docstring). kquant: the lowest KL of the recipes within 15% of rtn's bytes on both
    # trained test models (benchmarks/results/2026-12-02-int4-methods.md)
    method: str = "kquant"
    head_bits: int = (
        4  # the LM head and token table: 4 like the blocks, or 8 (MatMulNBits / GatherBlockQuantized bits=8)
    )
    # weight name -> [K, K] Hessian of its input activations, for gptq: filled by the quantize stage, not by users
    hessians: Mapping | None = field(default=None, repr=False, compare=False)

    def __post_init__(self):
        if isinstance(self.block_size, bool) or self.block_size not in BLOCK_SIZES:
            raise ExportError(f"int4 block size {self.block_size!r} is not one of {', '.join(map(str, BLOCK_SIZES))}.")
        if self.method not in METHODS:
            raise ExportError(f"int4 method {self.method!r} is not one of {', '.join(METHODS)}.")
        if isinstance(self.head_bits, bool) or self.head_bits not in HEAD_BITS:
            raise ExportError(f"int4 head bits {self.head_bits!r} is not one of {', '.join(map(str, HEAD_BITS))}.")

    @classmethod
    def for_recipe(cls, quantize: str, given) -> "Int4Options | None":
        """The options an export with `quantize` runs with: `given` (an Int4Options or None, the defaults) for
        int4, None for any other recipe, which refuses options given to it."""
        if given is not None and quantize != "int4":
            raise ExportError(f"int4 options go with quantize='int4' (--quantize int4), not {quantize!r}.")
        if given is not None and not isinstance(given, cls):
            raise ExportError(f"int4 must be an Int4Options (edgelm.export.Int4Options), not {type(given).__name__}.")
        return (given or cls()) if quantize == "int4" else None

    @property
    def head_method(self) -> str:
        """How the LM head and token table are rounded (the module docstring says why it may differ)."""
        return "rtn" if self.head_bits == 8 else ("clip" if self.method in ("hqq", "gptq") else self.method)

    def describe(self) -> dict:
        """The manifest's record of these options (weights.quantization)."""
        return {
            "block_size": self.block_size,
            "rounding": self.method,
            "symmetric": self.method not in ASYMMETRIC,
            "head_bits": self.head_bits,
            "head_rounding": self.head_method,
            **({"calibration": "export/calibrate.py's text and random-token rows"} if self.method == "gptq" else {}),
        }


@dataclass(frozen=True)
class BlockWeight:
    """A [N, K] weight in blocks along K: codes uint8 [N, nb, B] (0..2^bits - 1, unpacked), scale float32 [N, nb],
    zero_point None (symmetric: 2^(bits-1)), uint8 [N, nb] or float32 [N, nb] (hqq)."""

    codes: np.ndarray
    scale: np.ndarray
    zero_point: np.ndarray | None
    bits: int
    width: int  # K before padding

    @property
    def packed(self) -> np.ndarray:
        """uint8 [N, nb, B * bits / 8]: 4-bit codes two to a byte, low nibble first (MatMulNBits' blob)."""
        if self.bits == 8:
            return self.codes
        return self.codes[..., 0::2] | (self.codes[..., 1::2] << 4)

    def matmul_zero_points(self) -> np.ndarray | None:
        """MatMulNBits' zero_points: uint8 [N, ceil(nb * bits / 8)] (4-bit ones two to a byte), float as stored."""
        z = self.zero_point
        if z is None or z.dtype != np.uint8 or self.bits == 8:
            return z
        z = np.pad(z, ((0, 0), (0, z.shape[1] % 2)))
        return z[:, 0::2] | (z[:, 1::2] << 4)

    def dequantized(self) -> np.ndarray:
        """[N, K] float32: what the ops compute from the stored values."""
        zero = 2 ** (self.bits - 1) if self.zero_point is None else self.zero_point[..., None]
        values = (self.codes.astype(np.float32) - zero) * self.scale[..., None]
        return values.reshape(len(values), -1)[:, : self.width]


def padded_blocks(weight_nk: np.ndarray, block_size: int) -> np.ndarray:
    """[N, K] -> [N, ceil(K / B), B] float32, the tail block padded with zeros."""
    n, k = weight_nk.shape
    pad = -k % block_size
    weight = np.pad(weight_nk, ((0, 0), (0, pad))) if pad else weight_nk
    return np.ascontiguousarray(weight, dtype=np.float32).reshape(n, -1, block_size)


def quantize_blocks(weight_nk: np.ndarray, block_size: int, method: str = "rtn", bits: int = 4, hessian=None):
    """A [N, K] float weight -> BlockWeight by `method` (module docstring); gptq needs the [K, K] hessian."""
    n, k = weight_nk.shape
    if method == "gptq":
        from .gptq import gptq

        codes, scale = gptq(padded_blocks(weight_nk, block_size), hessian, bits)
        return BlockWeight(codes, scale, None, bits, k)
    if method == "hqq":
        return _hqq(weight_nk, block_size, bits)
    blocks = padded_blocks(weight_nk, block_size)
    codes, scale, zero = BLOCK_METHODS[method](blocks.reshape(-1, block_size), bits)
    shape = blocks.shape[:2]
    return BlockWeight(
        codes.reshape(blocks.shape), scale.reshape(shape), None if zero is None else zero.reshape(shape), bits, k
    )


def kquant(blocks: np.ndarray, bits: int):
    """llama.cpp's k-quant search, as onnxruntime's weight-only quantizer runs it (asymmetric, uint8 zero points)."""
    from onnxruntime.quantization.neural_compressor.weight_only import quant_tensor_k_quant_cpu

    codes, scale, zero = quant_tensor_k_quant_cpu(blocks, bits, blocks.shape[1])
    return codes.astype(np.uint8), scale[:, 0].astype(np.float32), zero[:, 0].astype(np.uint8)


def _hqq(weight_nk: np.ndarray, block_size: int, bits: int) -> BlockWeight:
    """onnxruntime's HQQ (torch): codes, scale and float zero point per block, w ~= (code - zero) * scale."""
    import torch

    quantizer = _onnxruntime_hqq()
    n, k = weight_nk.shape
    codes, scale, zero = quantizer.quantize_internal(torch.from_numpy(np.ascontiguousarray(weight_nk)), bits=bits,
                                                     group_size=block_size)  # fmt: skip
    return BlockWeight(
        codes.numpy().astype(np.uint8).reshape(n, -1, block_size),
        scale.numpy().astype(np.float32),
        zero.numpy().astype(np.float32),
        bits,
        k,
    )


def _onnxruntime_hqq():
    """onnxruntime's HQQ quantizer. Its module calls logging.basicConfig(level=INFO) as it is imported; the root
    logger is put back as it was, so importing it prints nothing later on."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        from onnxruntime.quantization.matmul_nbits_quantizer import HQQWeightOnlyQuantConfig, HQQWeightOnlyQuantizer
    finally:
        root.handlers[:], root.level = handlers, level
    return HQQWeightOnlyQuantizer(HQQWeightOnlyQuantConfig())


BLOCK_METHODS = {"rtn": rtn, "clip": clip, "kquant": kquant}  # (blocks [M, B], bits) -> (codes, scale, zero point)
