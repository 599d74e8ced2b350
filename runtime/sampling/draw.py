"""The picker at the end of the sampler chain: argmax, or one draw per row from softmax(logits).

A draw is the inverse CDF: the first token whose cumulative weight exceeds u * total, for one uniform u from the
row's own generator. One float64 cumulative sum over the vocabulary is a sequential pass (a quarter of a greedy
step's sampling budget on its own); the same token is found from 256-token block sums (float64, vectorised) and
one short cumulative sum inside the chosen block. A row with few tokens above -inf (after top_k) sums over those.
Weights are float32 exp(logit - row max), as the logits are; every sum over them is float64. From MANY_ROWS rows, a
draw no filter has banned tokens from runs as whole-batch operations (draw_many), with half of the rows' weights and
block sums computed on a second thread where a second core is free (Scratch.second_thread): the same tokens, in
fewer NumPy calls and on both cores. While onnxruntime's workers spin after a run (a session that spins: 1 ms,
engine/session.py), they hold that core, and the half on the second thread takes longer than the whole batch on one.
"""

import contextlib
import math
import os
import threading
from bisect import bisect_right
from itertools import accumulate

import numpy as np

from ..errors import GenerationOptionError

BLOCK = 256  # tokens per block of the inverse-CDF search: about sqrt(V) for GPT-2's 50,257
NEG_INF = np.float32(-np.inf)
FEW_ALIVE = 4096  # a row with at most this many tokens above -inf is summed over them only
REJECTION_TRIES = 8  # draws a row gets in a rejection draw (top_p's, the penalties') before it is drawn exactly


def running_totals(sums: list) -> list:
    """np.cumsum's float64 sums, as Python floats."""
    return list(accumulate(sums))


class Scratch:
    """Arrays reused from one step to the next by a SamplerChain. A fresh array the size of the vocabulary costs
    page faults every step (about 40 us for 200 KB, as much as the arithmetic done on it). second_thread: whether
    the draws may compute half of a batch's weights on a second thread (a second core is free while they run)."""

    def __init__(self, second_thread: bool = True):
        self._arrays = {}  # name -> ((shape, dtype), array)
        self.second_thread = second_thread

    def get(self, name: str, shape: tuple, dtype, zeros: bool = False) -> np.ndarray:
        """The array kept under `name`, made again when the shape or dtype changed. Its contents are whatever was
        last written there (zeros when made with zeros=True, and wherever nobody writes)."""
        kept = self._arrays.get(name)  # compared as given: np.dtype(dtype) every step would cost more than the rest
        if kept is None or kept[0] != (shape, dtype):
            kept = self._arrays[name] = ((shape, dtype), (np.zeros if zeros else np.empty)(shape, dtype))
        return kept[1]


def draw_rows(padded: np.ndarray, ends: list, rngs: list, n_vocab: int) -> np.ndarray:
    """One draw per row from padded weights, given their block ends, with one uniform from each row's generator."""
    # [B, n_blocks * BLOCK], B lists -> [B] int64
    return np.array([search(row, e, rng.random(), n_vocab) for row, e, rng in zip(padded, ends, rngs)], np.int64)


def weights(
    logits: np.ndarray,
    scratch: Scratch | None = None,
    peak: np.ndarray | None = None,
    finite: bool = False,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """exp(logit - row max) in float32, padded with zeros to whole blocks; 0 for -inf. peak: the row maxima [B],
    when the caller has them; finite: the caller has checked that they are all finite; out: the padded array to
    write (zeros past V), else the scratch's."""
    # [B, V] -> [B, n_blocks * BLOCK] float32 (a row of all -inf, or with +inf, gives NaN: callers skip it)
    if out is None:
        shape = (logits.shape[0], -(-logits.shape[-1] // BLOCK) * BLOCK)
        out = (scratch or Scratch()).get("weights", shape, np.float32, zeros=True)  # only [:, :V] is ever written
    padded, w = out, out[:, : logits.shape[-1]]
    peak = logits.max(axis=-1) if peak is None else peak
    # inf - inf is the only invalid operation here; the error state costs as much as the subtraction right after
    # a model step, so a finite maximum goes without it (exp's underflow to 0 is ignored by default)
    with contextlib.nullcontext() if finite else np.errstate(invalid="ignore"):
        np.subtract(logits, peak[:, None], out=w)
        np.exp(w, out=w)
    return padded


def row_weights(row: np.ndarray, scratch: Scratch) -> tuple[np.ndarray, list] | None:
    """weights() and block_ends() of one row in fewer NumPy calls (the peak from an argmax, a scalar subtraction);
    None when the row's maximum is not finite (NaN or +inf, or all -inf)."""
    # [V] -> ([n_blocks * BLOCK] float32, n_blocks floats), the same values as weights() and block_ends() give
    peak = row[row.argmax()]  # argmax stops at the first NaN: its peak is then NaN, not finite
    if not math.isfinite(peak):
        return None
    padded = scratch.get("weights", (1, -(-row.size // BLOCK) * BLOCK), np.float32, zeros=True)[0]
    w = padded[: row.size]
    np.subtract(row, peak, out=w)  # finite: no invalid operation, and exp's underflow to 0 is ignored by default
    np.exp(w, out=w)
    return padded, running_totals(block_sums(padded[None]).tolist()[0])


def pick(
    logits, do_sample: bool, rngs: list, given_weights=None, scratch: Scratch | None = None, dense: bool = False
) -> np.ndarray:
    """Choose one token per row: argmax, or one draw from softmax(logits) with that row's own generator.

    Robust to non-finite logits (a model or filter gone past float32's range): NaN counts as banned, and a
    row holding +inf picks among its +inf tokens only, each equally likely (the limit of its distribution).
    given_weights: weights(logits) when the caller has them already (top_p computes them). dense: no filter has
    banned tokens, so no row is looked at for having few tokens left (a speed hint: the same token either way).
    """
    # [B, V] -> [B] int64
    if not do_sample:  # one argmax, unless a row's maximum is not finite: checked() then says what to do
        best = logits.argmax(axis=-1)
        if all(map(math.isfinite, logits[np.arange(len(best)), best].tolist())):
            return best.astype(np.int64, copy=False)
    if do_sample and dense and given_weights is None and len(rngs) == logits.shape[0]:
        picks = _draw_dense(logits, rngs, scratch)
        if picks is not None:
            return picks
    cleaned, best, peak = checked(logits)
    if not do_sample:
        return best.astype(np.int64)
    if len(rngs) != logits.shape[0]:
        raise ValueError(f"pick needs one random generator per row: got {len(rngs)} for {logits.shape[0]} rows")
    logits, given_weights = (logits, given_weights) if cleaned is None else (cleaned, None)
    u = np.array([rng.random() for rng in rngs])  # one uniform draw per row and step
    if given_weights is not None:
        return inverse_cdf(given_weights, u, logits.shape[-1])
    sparse = np.zeros(logits.shape[0], dtype=bool)
    if logits.shape[-1] > FEW_ALIVE:  # a row can only be sparse if it holds -inf: one reduction says it does not
        banned = np.flatnonzero(logits.min(axis=-1) == NEG_INF)
        sparse[banned] = [np.count_nonzero(logits[r] != NEG_INF) <= FEW_ALIVE for r in banned]
    else:
        sparse[:] = True
    picks = np.empty(logits.shape[0], dtype=np.int64)
    for r in np.flatnonzero(sparse):  # after top_k: exp and sum over the few tokens left only
        ids = np.flatnonzero(logits[r] != NEG_INF)
        picks[r] = among(ids, logits[r, ids], peak[r], u[r])
    dense = np.flatnonzero(~sparse)
    if dense.size:
        dense_rows = logits if dense.size == len(picks) else logits[dense]
        picks[dense] = inverse_cdf(weights(dense_rows, scratch, peak[dense]), u[dense], logits.shape[-1])
    return picks


MANY_ROWS = 4  # from this many rows a dense draw runs as whole-batch operations (see the module docstring)
_second_thread = (None, None)  # (the process id, that thread's executor), made on first use in each process
_making = threading.Lock()


def _draw_dense(logits, rngs, scratch) -> np.ndarray | None:
    # pick's draw in as few operations as it takes (each costs more than its arithmetic right after a model step,
    # whose weights have pushed the sampler's code and data out of the caches); None when a row's maximum is not
    # finite, before any generator is used: pick's checks handle that row.
    scratch = scratch or Scratch()
    if logits.shape[0] == 1:
        found = row_weights(logits[0], scratch)
        if found is None:
            return None
        padded, ends = found
        return np.array([search(padded, ends, rngs[0].random(), logits.shape[-1])], np.int64)
    peak = logits.max(axis=-1)  # NaN propagates: finite exactly when the row has no NaN or infinity at the top
    if not all(map(math.isfinite, peak.tolist())):
        return None
    if logits.shape[0] < MANY_ROWS:
        padded = weights(logits, scratch, peak, finite=True)
        return draw_rows(padded, block_ends(padded), rngs, logits.shape[-1])
    padded, sums = weights_and_sums(logits, scratch, peak)
    return draw_many(padded, sums, np.array([rng.random() for rng in rngs]), logits.shape[-1])


def weights_and_sums(logits, scratch: Scratch, peak: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(weights(logits), their block_sums) for rows of finite maxima; the second half of the rows on a second
    thread (NumPy's loops run without the GIL) when scratch.second_thread: the same arrays, in less time where a
    second core is free."""
    n_rows, n_vocab = logits.shape
    padded = scratch.get("weights", (n_rows, -(-n_vocab // BLOCK) * BLOCK), np.float32, zeros=True)
    sums = scratch.get("block_sums", (n_rows, padded.shape[1] // BLOCK), np.float64)

    def rows(lo, hi):
        block_sums(weights(logits[lo:hi], peak=peak[lo:hi], finite=True, out=padded[lo:hi]), out=sums[lo:hi])

    if not scratch.second_thread:
        rows(0, n_rows)
        return padded, sums
    half = n_rows // 2
    try:
        later = _executor().submit(rows, half, n_rows)
    except RuntimeError:  # the interpreter is shutting down: no new thread's work, both halves here
        rows(half, n_rows)
        later = None
    try:
        rows(0, half)
    finally:  # its rows are written before the arrays are used again, whatever happened here
        if later is not None:
            later.result()
    return padded, sums


def _executor():
    """The second thread's executor of this process (a forked child has its parent's without the thread)."""
    global _second_thread
    with _making:
        if _second_thread[0] != os.getpid():
            from concurrent.futures import ThreadPoolExecutor

            _second_thread = (os.getpid(), ThreadPoolExecutor(1, thread_name_prefix="edgelm-sampler"))
        return _second_thread[1]


def draw_many(padded: np.ndarray, sums: np.ndarray, u: np.ndarray, n_vocab: int) -> np.ndarray:
    """inverse_cdf for a batch, given its block_sums, in whole-batch operations: the tokens search() finds row by
    row (the same float64 sums, added in the same order), in fewer NumPy calls for many rows."""
    # [B, n_blocks * BLOCK] weights, [B, n_blocks] block sums, [B] uniform in [0, 1) -> [B] int64
    rows = np.arange(len(u))
    ends = np.cumsum(sums, axis=-1)  # sequential along each row, as running_totals
    target = u * ends[:, -1]
    block = np.minimum(np.count_nonzero(ends <= target[:, None], axis=-1), ends.shape[1] - 1)  # bisect_right
    offset = np.where(block > 0, ends[rows, block - 1], 0.0)
    inner = np.cumsum(padded.reshape(len(u), -1, BLOCK)[rows, block], axis=-1, dtype=np.float64)
    inner += offset[:, None]
    above = inner > target[:, None]
    first = above.argmax(axis=-1)
    tokens = block * BLOCK + np.where(above[rows, first], first, BLOCK)
    for r in np.flatnonzero(tokens >= np.minimum((block + 1) * BLOCK, n_vocab)):  # as search(): a block's end
        tokens[r] = last_weighted(padded[r], int(block[r]), n_vocab)
    return tokens.astype(np.int64, copy=False)


def among(ids: np.ndarray, values: np.ndarray, peak: np.float32, u: float) -> int:
    """One draw from softmax over the few tokens `ids` of a row (every other token is -inf): the first whose float64
    cumulative weight exceeds u * total. peak: the row's maximum, float32; u: uniform in [0, 1)."""
    # [n] ascending ids, [n] their float32 logits -> token id
    w = np.exp(values - peak).tolist()  # the same float32 weights as weights() gives
    if not all(w):  # underflow to 0: such a token is never drawn
        ids, w = ids[np.flatnonzero(w)], [x for x in w if x]
    cdf = list(accumulate(w))  # np.cumsum's float64 sums
    return int(ids[min(bisect_right(cdf, u * cdf[-1]), len(ids) - 1)])


def checked(logits) -> tuple[np.ndarray | None, np.ndarray, np.ndarray]:
    """(cleaned logits or None, argmax [B], max [B]); raises GenerationOptionError for a row with nothing left.

    NaN counts as banned; a row holding +inf keeps its +inf tokens only, at 0 (each equally likely). The cleaned
    copy is None when every row's maximum is finite: the logits are fine as they are.
    """
    rows = np.arange(logits.shape[0])
    best = logits.argmax(axis=-1)
    peak, cleaned = logits[rows, best], None
    if not np.isfinite(peak).all():  # NaN propagates to the argmax: one check covers both
        cleaned = np.where(np.isnan(logits), NEG_INF, logits)
        infinite = np.isposinf(cleaned).any(axis=-1)
        cleaned[infinite] = np.where(np.isposinf(cleaned[infinite]), 0, NEG_INF)
        best = cleaned.argmax(axis=-1)
        peak = cleaned[rows, best]
    dead = np.flatnonzero(peak == NEG_INF)
    if dead.size:
        raise GenerationOptionError(
            f"every token was banned for row(s) {dead.tolist()}: loosen bad_words_ids, no_repeat_ngram_size, logit_bias or the constraint"
        )
    return cleaned, best, peak


def block_sums(padded: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """The weight of each block, float64 (written into `out` when given)."""
    # [B, n_blocks * BLOCK] -> [B, n_blocks]
    return np.add.reduce(padded.reshape(padded.shape[0], -1, BLOCK), axis=-1, dtype=np.float64, out=out)


def block_ends(padded: np.ndarray) -> list[list[float]]:
    """The cumulative weight at the end of each block, per row: np.cumsum's float64 sums, as Python floats (which
    search reads in fewer NumPy calls, each of which costs tens of microseconds right after a model step has pushed
    NumPy's code out of the caches)."""
    # [B, n_blocks * BLOCK] -> B lists of n_blocks floats
    return [running_totals(sums) for sums in block_sums(padded).tolist()]


def inverse_cdf(padded: np.ndarray, u: np.ndarray, n_vocab: int) -> np.ndarray:
    """Per row, the first token whose cumulative weight exceeds u * total, as one float64 cumulative sum over the
    row would find it: a search over block_ends, then inside the one block (zero weights are never chosen)."""
    # [B, n_blocks * BLOCK] weights, [B] uniform in [0, 1) -> [B] int64
    ends = block_ends(padded)
    return np.array([search(row, row_ends, x, n_vocab) for row, row_ends, x in zip(padded, ends, u)], dtype=np.int64)


def search(padded_row: np.ndarray, ends: list, u: float, n_vocab: int) -> int:
    """inverse_cdf for one row, given its block_ends (a row is searched again and again by rejection sampling)."""
    # [n_blocks * BLOCK], [n_blocks] floats, uniform in [0, 1) -> token id; every sum float64
    target = u * ends[-1]
    block = min(bisect_right(ends, target), len(ends) - 1)  # np.searchsorted(side="right")
    offset, start = ends[block - 1] if block else 0.0, block * BLOCK
    # the block's running sums: float64, added one after the other (as np.cumsum adds them), then the offset added to
    # each, as the row's would be; on Python floats, which take one NumPy call (tolist)
    inner = running_totals(padded_row[start : start + BLOCK].tolist())
    token = start + bisect_right(inner, target, key=offset.__add__)  # start + BLOCK when none is above
    if token >= min((block + 1) * BLOCK, n_vocab):
        token = last_weighted(padded_row, block, n_vocab)
    return token


def last_weighted(padded_row: np.ndarray, block: int, n_vocab: int) -> int:
    """The last token with weight up to the end of `block`: the draw when the chosen block's own sum and the running
    sum it was chosen by round differently (the block's sum is positive, so there is one)."""
    return int(np.flatnonzero(padded_row[: min((block + 1) * BLOCK, n_vocab)] > 0)[-1])
