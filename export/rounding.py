"""The symmetric block roundings the int4 methods share (export/int4.py: rtn, clip, and gptq's per-block scales):
[M, B] float32 blocks -> uint8 codes and one float32 scale per block, zero point 2^(bits-1) implied.
NumPy only; nothing here knows the recipe's options."""

import numpy as np

CLIP_STEPS = 20  # candidates between absmax and CLIP_MIN x absmax
CLIP_MIN = 0.5
SMALLEST_SCALE = np.finfo(np.float32).tiny  # a block of subnormal weights keeps a scale it can divide by


def symmetric_codes(blocks: np.ndarray, scale: np.ndarray, bits: int) -> np.ndarray:
    """[M, B] blocks at [M] scales -> uint8 codes, round to nearest, clipped to the 2^bits levels."""
    half = 2 ** (bits - 1)
    return (np.clip(np.rint(blocks / scale[:, None]), -half, half - 1) + half).astype(np.uint8)


def rtn(blocks: np.ndarray, bits: int):
    """Symmetric round to nearest: the block's absmax maps to the largest positive level."""
    absmax = np.abs(blocks).max(axis=-1)
    scale = np.where(absmax > 0, np.maximum(absmax / (2 ** (bits - 1) - 1), SMALLEST_SCALE), 1.0).astype(np.float32)
    return symmetric_codes(blocks, scale, bits), scale, None


def block_error(blocks: np.ndarray, codes: np.ndarray, scale: np.ndarray, bits: int) -> np.ndarray:
    """[M] squared error of each symmetric block as stored."""
    restored = (codes.astype(np.float32) - 2 ** (bits - 1)) * scale[:, None]
    return np.square(restored - blocks).sum(axis=-1)


def clip(blocks: np.ndarray, bits: int):
    """Symmetric, each block's scale the best of CLIP_STEPS shrunk absmax candidates (rtn's first, kept on ties)."""
    codes, scale, _ = rtn(blocks, bits)
    best = block_error(blocks, codes, scale, bits)
    for factor in np.linspace(1.0, CLIP_MIN, CLIP_STEPS + 1)[1:]:
        trial_scale = np.maximum(scale * factor, SMALLEST_SCALE).astype(np.float32)
        trial = symmetric_codes(blocks, trial_scale, bits)
        error = block_error(blocks, trial, trial_scale, bits)
        better = error < best
        codes[better], scale[better], best[better] = trial[better], trial_scale[better], error[better]
    return codes, scale, None
