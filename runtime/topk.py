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

import math

import numpy as np

from . import draw

BLOCK = 256  # tokens per block maximum; halved (down to MIN_BLOCK) until there are at least k blocks
MIN_BLOCK = 16


def kept(row: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The ascending ids of every token top_k keeps in one row, each logit >= the k-th largest, and their logits."""
    # [V] float32, 0 < k < V -> ([m] int64, [m] float32), m >= k (ties with the k-th kept, as transformers keeps them)
    ids = candidates(row, k)
    if ids is not None:
        values = row[ids]
        if not np.isnan(values.max()):  # np.max propagates NaN
            kth = np.partition(values, values.size - k)[values.size - k]
            keep = values >= kth
            return ids[keep], values[keep]
    kth = np.partition(row, row.size - k)[row.size - k]  # NaN sorts last: counted as the largest, and kept
    ids = np.flatnonzero(~(row < kth))
    return ids, row[ids]


def candidates(row: np.ndarray, k: int) -> np.ndarray | None:
    """Ascending ids of a set of tokens that holds every token top_k keeps, and every NaN, found from block maxima;
    None where the shortcut does not apply (fewer than k blocks even at MIN_BLOCK). A row holding NaN gives a set
    that holds its NaN: callers look for one there, and partition such a row whole."""
    # [V] float32 -> [m] int64, or None
    block = BLOCK
    while row.size // block < k and block > MIN_BLOCK:
        block //= 2
    whole = row.size // block
    if whole < k:
        return None
    # the maxima of any k disjoint groups of tokens are k distinct tokens: the tail past the last block may be left out
    # (ufuncs and methods called directly: NumPy's Python wrappers cost microseconds each right after a model step)
    maxima = np.maximum.reduce(row[: whole * block].reshape(whole, block), axis=1)  # [whole], a new array
    maxima.partition(whole - k)  # NaN sorts last; a NaN bound keeps every token
    return (~(row < maxima[whole - k])).nonzero()[0]  # NaN is not below the bound: kept, and seen by the caller


def draw_kept(out: np.ndarray, k: int, rngs: list) -> np.ndarray:
    """top_k then the pick, in one step: one draw per row among the tokens top_k keeps, the same token for the
    same generator as draw.pick on the filtered row (whose path for rows with few tokens left it shares)."""
    # [B, V] float32 -> [B] int64; out is left as it is
    if len(rngs) != out.shape[0]:
        raise ValueError(f"pick needs one random generator per row: got {len(rngs)} for {out.shape[0]} rows")
    picks = np.empty(out.shape[0], dtype=np.int64)
    for r, (row, rng) in enumerate(zip(out, rngs)):
        ids = candidates(row, k) if k < row.size else None
        if ids is not None and ids.size <= draw.FEW_ALIVE:
            values = row[ids]
            listed = values.tolist()
            # pick's own path, for a row whose kept tokens are all finite: on Python floats past the one exp
            # (each NumPy call costs tens of microseconds right after a model step)
            if math.isfinite(sum(listed)):  # no NaN or infinity among the candidates
                ordered = sorted(listed)
                kth, peak = ordered[len(ordered) - k], ordered[-1]
                w = np.exp(values - peak).tolist()  # peak, a float32 value, is subtracted in float32
                w = [x if v >= kth else 0.0 for x, v in zip(w, listed)]  # the tokens top_k removes weigh nothing
                picks[r] = draw.among_weights(ids, w, rng.random())
                continue
        filtered = row[None].copy()
        if k < row.size:
            ids, values = kept(row, k)
            filtered[0] = draw.NEG_INF
            filtered[0, ids] = values
        picks[r] = draw.pick(filtered, True, [rng])[0]
    return picks
