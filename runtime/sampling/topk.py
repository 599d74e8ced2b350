"""top_k without partitioning the vocabulary: the tokens it keeps, and the chain's draw among them.

transformers' TopKLogitsWarper keeps every logit >= the row's k-th largest (ties with it included). np.partition
finds that value in O(V), but with a large constant and a copy of the row. The maxima of the row's blocks
(BLOCK tokens each, one vectorised reduction) are k distinct elements of the row at least, so the k-th largest
block maximum is a lower bound for the k-th largest logit: only the tokens at or above it (usually a little
over k) can be kept, and the k-th largest of those is the row's. A row holding NaN, or a k above the number of
blocks, is partitioned whole, as before.

When top_k is the last filter of a sampler chain, the chain needs one token, not a row of -inf: draw_kept draws
among the kept tokens directly, exactly as draw.pick would from the filtered row.
"""

import functools
import math
from bisect import bisect_right
from itertools import accumulate

import numpy as np

from . import draw

BLOCK = 256  # tokens per block maximum; halved (down to MIN_BLOCK) until there are at least k blocks
MIN_BLOCK = 16


def kept(row: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The ascending ids of every token top_k keeps in one row, each logit >= the k-th largest, and their logits."""
    # [V] float32, 0 < k < V -> ([m] int64, [m] float32), m >= k (ties with the k-th kept, as transformers keeps them)
    ids = candidates(row, k)
    if ids is None:
        kth = np.partition(row, row.size - k)[row.size - k]  # NaN sorts last: counted as the largest, and kept
        ids = np.flatnonzero(~(row < kth))
        return ids, row[ids]
    values = row[ids]
    kth = np.partition(values, values.size - k)[values.size - k]
    keep = values >= kth
    return ids[keep], values[keep]


def candidates(row: np.ndarray, k: int) -> np.ndarray | None:
    """Ascending ids of a set of tokens that holds every token top_k keeps, found from block maxima; None where
    the shortcut does not apply (fewer than k blocks even at MIN_BLOCK, or NaN in the row)."""
    # [V] float32 -> [m] int64, or None
    block = BLOCK
    while row.size // block < k and block > MIN_BLOCK:
        block //= 2
    whole = row.size // block
    if whole < k or np.isnan(row.max()):  # np.max propagates NaN
        return None
    # the maxima of any k disjoint groups of tokens are k distinct tokens: the tail past the last block may be left out
    maxima = row[: whole * block].reshape(whole, block).max(axis=1)  # [whole]
    bound = np.partition(maxima, whole - k)[whole - k]
    return np.flatnonzero(row >= bound)


def draw_kept(out: np.ndarray, k: int, rngs: list) -> np.ndarray:
    """top_k then the pick, in one step: one draw per row among the tokens top_k keeps, the same token for the
    same generator as draw.pick on the filtered row (whose path for rows with few tokens left it shares)."""
    # [B, V] float32 -> [B] int64; out is left as it is
    if len(rngs) != out.shape[0]:
        raise ValueError(f"pick needs one random generator per row: got {len(rngs)} for {out.shape[0]} rows")
    picks = np.empty(out.shape[0], dtype=np.int64)
    for r, (row, rng) in enumerate(zip(out, rngs)):
        token = draw_one(row, k, rng)
        if token is not None:
            picks[r] = token
            continue
        ids = values = None
        if k < row.size:
            ids, values = kept(row, k)
            peak = values.max()
            # pick's own path, for a row with few tokens left, a finite maximum and no -inf among those kept
            if ids.size <= draw.FEW_ALIVE and np.isfinite(peak) and values.min() > draw.NEG_INF:
                picks[r] = draw.among(ids, values, peak, rng.random())
                continue
        filtered = row[None].copy()
        if ids is not None:
            filtered[0] = draw.NEG_INF
            filtered[0, ids] = values
        picks[r] = draw.pick(filtered, True, [rng])[0]
    return picks


def draw_one(row: np.ndarray, k: int, rng) -> int | None:
    """draw_kept for one row in fewer NumPy calls (each costs tens of microseconds right after a model step): the
    k-th largest and the draw on Python floats, over the few candidates found from block maxima. None, before the
    generator is used, where the row is not the common case (NaN or an infinity among the block maxima, -inf among
    the kept tokens, fewer than k blocks): draw_kept's own path then draws."""
    # [V] float32 -> token id or None
    starts = _block_starts(row.size, k)
    if starts is None:
        return None
    maxima = np.maximum.reduceat(row, starts)  # each block's maximum, the tail past the last whole block included
    ordered = np.partition(maxima, (maxima.size - k, maxima.size - 1))  # NaN sorts last
    bound, top = ordered[maxima.size - k], ordered[-1]
    if not (math.isfinite(bound) and math.isfinite(top)):  # NaN or +inf in the row, or -inf at the bound
        return None
    ids = (row >= bound).nonzero()[0]  # every token top_k keeps, and a few others (np.flatnonzero, less wrapping)
    values = row.take(ids)
    logits = values.tolist()
    kth = sorted(logits)[-k]  # the row's k-th largest logit: the candidates hold the k largest
    # the weights of every candidate, float32 as draw.among computes them (exp is elementwise: the same values as
    # over the kept ones alone); those under the k-th largest are left out
    weights = np.exp(values - top).tolist()
    kept = [(token, w) for token, w, x in zip(ids.tolist(), weights, logits) if x >= kth]
    if len(kept) > draw.FEW_ALIVE:  # ties at the k-th: draw_kept draws from the filtered row
        return None
    kept = [(token, w) for token, w in kept if w]  # underflow to 0: never drawn
    cdf = list(accumulate(w for _, w in kept))  # np.cumsum's float64 sums
    return kept[min(bisect_right(cdf, rng.random() * cdf[-1]), len(kept) - 1)][0]


@functools.lru_cache(maxsize=16)
def _block_starts(n_vocab: int, k: int) -> np.ndarray | None:
    # the first token of each block (candidates' block size for k), the tail included; None with fewer than k blocks
    block = BLOCK
    while n_vocab // block < k and block > MIN_BLOCK:
        block //= 2
    if n_vocab // block < k:
        return None
    starts = np.arange(0, n_vocab, block)
    starts.flags.writeable = False
    return starts
