"""The picker at the end of the sampler chain: argmax, or one draw per row from softmax(logits).

A draw is the inverse CDF: the first token whose cumulative weight exceeds u * total, for one uniform u from the
row's own generator. One float64 cumulative sum over the vocabulary is a sequential pass (a quarter of a greedy
step's sampling budget on its own); the same token is found from 256-token block sums (float64, vectorised) and
one short cumulative sum inside the chosen block. A row with few tokens above -inf (after top_k) sums over those.
Weights are float32 exp(logit - row max), as the logits are; every sum over them is float64.
"""

import numpy as np

from .errors import GenerationOptionError

NEG_INF = np.float32(-np.inf)
BLOCK = 256  # tokens per block of the inverse-CDF search: about sqrt(V) for GPT-2's 50,257
FEW_ALIVE = 4096  # a row with at most this many tokens above -inf is summed over them only


class Scratch:
    """Arrays reused from one step to the next by a SamplerChain. A fresh array the size of the vocabulary costs
    page faults every step (about 40 us for 200 KB, as much as the arithmetic done on it)."""

    def __init__(self):
        self._arrays = {}

    def get(self, name: str, shape: tuple, dtype, zeros: bool = False) -> np.ndarray:
        """The array kept under `name`, made again when the shape or dtype changed. Its contents are whatever was
        last written there (zeros when made with zeros=True, and wherever nobody writes)."""
        array = self._arrays.get(name)
        if array is None or array.shape != shape or array.dtype != dtype:
            array = self._arrays[name] = (np.zeros if zeros else np.empty)(shape, dtype)
        return array


def weights(logits: np.ndarray, scratch: Scratch | None = None) -> np.ndarray:
    """exp(logit - row max) in float32, padded with zeros to whole blocks; 0 for -inf."""
    # [B, V] -> [B, n_blocks * BLOCK] float32 (a row of all -inf, or with +inf, gives NaN: callers skip it)
    shape = (logits.shape[0], -(-logits.shape[-1] // BLOCK) * BLOCK)
    padded = (scratch or Scratch()).get("weights", shape, np.float32, zeros=True)  # only [:, :V] is ever written
    w = padded[:, : logits.shape[-1]]
    with np.errstate(invalid="ignore"):
        np.subtract(logits, logits.max(axis=-1, keepdims=True), out=w)
        np.exp(w, out=w)
    return padded


def pick(logits, do_sample: bool, rngs: list, given_weights=None, scratch: Scratch | None = None) -> np.ndarray:
    """Choose one token per row: argmax, or one draw from softmax(logits) with that row's own generator.

    Robust to non-finite logits (a model or filter gone past float32's range): NaN counts as banned, and a
    row holding +inf picks among its +inf tokens only, each equally likely (the limit of its distribution).
    given_weights: weights(logits) when the caller has them already (top_p computes them).
    """
    # [B, V] -> [B] int64
    rows = np.arange(logits.shape[0])
    best = logits.argmax(axis=-1)
    if not np.isfinite(logits[rows, best]).all():  # NaN propagates to the argmax: one check covers both
        logits = np.where(np.isnan(logits), NEG_INF, logits)
        infinite = np.isposinf(logits).any(axis=-1)
        logits[infinite] = np.where(np.isposinf(logits[infinite]), 0, NEG_INF)
        best, given_weights = logits.argmax(axis=-1), None
    dead = np.flatnonzero(logits[rows, best] == NEG_INF)
    if dead.size:
        raise GenerationOptionError(
            f"every token was banned for row(s) {dead.tolist()}: loosen bad_words_ids, no_repeat_ngram_size or logit_bias"
        )
    if not do_sample:
        return best.astype(np.int64)
    if len(rngs) != logits.shape[0]:
        raise ValueError(f"pick needs one random generator per row: got {len(rngs)} for {logits.shape[0]} rows")
    u = np.array([rng.random() for rng in rngs])  # one uniform draw per row and step
    if given_weights is not None:
        return _inverse_cdf(given_weights, u, logits.shape[-1])
    sparse = np.array([np.count_nonzero(row != NEG_INF) <= FEW_ALIVE for row in logits])  # per row: a third
    picks = np.empty(logits.shape[0], dtype=np.int64)  # of the time of np.count_nonzero(..., axis=-1)
    for r in np.flatnonzero(sparse):  # after top_k: exp and sum over the few tokens left only
        ids = np.flatnonzero(logits[r] != NEG_INF)
        w = np.exp(logits[r, ids] - logits[r, best[r]])  # the same float32 weights as weights() gives
        ids, w = ids[w > 0], w[w > 0]
        cdf = np.cumsum(w, dtype=np.float64)
        picks[r] = ids[min(np.searchsorted(cdf, u[r] * cdf[-1], side="right"), len(ids) - 1)]
    dense = np.flatnonzero(~sparse)
    if dense.size:
        dense_rows = logits if dense.size == len(picks) else logits[dense]
        picks[dense] = _inverse_cdf(weights(dense_rows, scratch), u[dense], logits.shape[-1])
    return picks


def _inverse_cdf(padded: np.ndarray, u: np.ndarray, n_vocab: int) -> np.ndarray:
    # [B, n_blocks * BLOCK] weights, [B] uniform in [0, 1) -> [B] int64: per row, the first token whose
    # cumulative weight exceeds u * total, as one float64 cumulative sum over the row would find it. Two short
    # searches instead: over the blocks' sums, then inside the one block (zero weights are never chosen).
    blocks = padded.reshape(padded.shape[0], -1, BLOCK)  # [B, n_blocks, BLOCK]
    ends = np.cumsum(blocks.sum(axis=-1, dtype=np.float64), axis=-1)  # [B, n_blocks] cumulative weight
    target = u * ends[:, -1]  # [B]
    rows = np.arange(len(u))
    block = np.minimum((ends <= target[:, None]).sum(axis=-1), ends.shape[1] - 1)
    start = np.where(block > 0, ends[rows, block - 1], 0.0)
    inner = start[:, None] + np.cumsum(blocks[rows, block], axis=-1, dtype=np.float64)  # [B, BLOCK]
    picks = block * BLOCK + (inner <= target[:, None]).sum(axis=-1)
    for r in np.flatnonzero(picks >= np.minimum((block + 1) * BLOCK, n_vocab)):
        # the block's own sum and the one it was chosen by round differently: its last token with weight
        picks[r] = np.flatnonzero(padded[r, : min((block[r] + 1) * BLOCK, n_vocab)] > 0)[-1]
    return picks.astype(np.int64)
