"""Top-p (nucleus) sampling without sorting the vocabulary: where the cut falls, applying it, drawing from it.

transformers' TopPLogitsWarper sorts a row ascending by logit, takes the cumulative sum of its softmax and
removes every token whose cumulative probability is <= 1 - p. The removed tokens are therefore a prefix of the
ascending order, and one key says where it ends: the first token kept. Only the tokens near that cut need an
order. A log-scale histogram finds them in one pass: the float32 bit patterns of non-negative probabilities,
read as integers, sort like the values, so `bits >> 17` is a bucket index, 64 buckets per octave, ascending.
np.bincount gives each bucket's mass; the bucket where the cumulative mass crosses 1 - p is split the same way
with finer buckets until it is small, and only it is sorted. The cost is O(V) whatever the nucleus holds: a
flat row (random weights: the nucleus is most of the vocabulary) costs what a peaked one does, where a sort
costs O(V log V).

Ties: tokens with equal logits have equal probabilities, so they always share a bucket, and the cut orders them
by token id, like a stable sort (torch's CPU sort is not stable, so transformers' choice among equal logits at
the cut depends on the row's length; the number of tokens kept is the same).

When top_p is the last filter of a sampler chain, the chain needs one token, not the cut: draw_from samples
the whole row and accepts a token the cut keeps (keeps tests one token in one pass), which is cheaper at the
usual p (0.9, 0.95) and gives exactly the same distribution.
"""

import math

import numpy as np

from . import draw
from .draw import Scratch

_SHIFTS = (17, 8, 0)  # bucket widths in float32 ulps at each level: 64 per octave, then 32,768, then exact values
SORT_AT_MOST = 2048  # a set of tokens this small is sorted instead of split again
_GROUP = 64  # the cumulative mass is searched over groups of 64 buckets first, then inside one group


def order_keys(logits: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """One int64 per token that sorts like (logit, token id): the ascending order of a stable sort by logit."""
    # [n] float32, [n] int -> [n] int64
    bits = (logits + np.float32(0)).view(np.int32)  # + 0 turns -0.0 into 0.0: equal logits, equal keys
    ordered = bits ^ ((bits >> 31) & np.int32(0x7FFFFFFF))  # negative floats: flip the magnitude bits
    return (ordered.astype(np.int64) << 32) | ids.astype(np.int64)


def first_kept(logits, probs, threshold, work=None) -> tuple[float, np.ndarray] | None:
    """Where transformers' top-p cut falls in one row, before min_tokens_to_keep.

    logits [V] float32 and probs = their softmax [V] float32 (all finite or 0); threshold = float32(1 - p).
    work: ([V] intp, [V] float64) arrays to work in, or None (a caller that runs every step keeps them: a fresh
    array this large costs page faults each time). Returns (logit, ids): every token whose logit is below `logit`
    is removed, and so are the tokens `ids` (ties with it that come first by token id); every other token is kept.
    None when the cut removes every token, or in a rounding edge case: the caller then sorts the row.
    """
    below, ids = 0.0, None  # the tokens at the cut (None: all) and the probability of every token under them
    for shift in _SHIFTS:
        p = probs if ids is None else probs[ids]
        bits = p.view(np.int32)
        low = 0 if ids is None else bits.min()  # ids came from one bucket of the level above: a short range
        if p.size <= SORT_AT_MOST or bits.max() == low:
            break
        bucket, weights = work if ids is None and work is not None else (np.empty(p.size, np.intp), None)
        if low:
            np.subtract(bits, low, out=bucket)
            bucket >>= shift  # [n] ascending with the probability
        else:
            np.right_shift(bits, shift, out=bucket)
        if weights is None:
            weights = p.astype(np.float64)  # np.bincount sums float64 weights: it would convert them itself
        else:
            np.copyto(weights, p)
        crossing, below = _crossing(np.bincount(bucket, weights=weights), below, threshold)
        if crossing is None:
            return None
        inside = np.flatnonzero(bucket == crossing)
        ids = inside if ids is None else ids[inside]
    return _cut_in_order(logits, probs, np.arange(probs.size) if ids is None else ids, below, threshold)


def _crossing(mass, below, threshold):
    # [n] float64 bucket masses, ascending -> (the first bucket whose cumulative mass `below` + mass[:d + 1] is
    # > threshold in float32, the cumulative mass before it); (None, None) when no bucket is.
    groups = -(-mass.size // _GROUP)
    padded = np.zeros(groups * _GROUP)
    padded[: mass.size] = mass
    ends = below + np.cumsum(padded.reshape(groups, _GROUP).sum(axis=1))  # [groups]
    group = int(np.count_nonzero(ends.astype(np.float32) <= threshold))  # those groups are removed whole
    if group == groups:
        return None, None
    start = ends[group - 1] if group else below
    fine = start + np.cumsum(padded[group * _GROUP : (group + 1) * _GROUP])
    inside = int(np.count_nonzero(fine.astype(np.float32) <= threshold))
    if inside == _GROUP:
        return None, None  # the group's sum and its cumulative sum round differently: the caller sorts
    return group * _GROUP + inside, fine[inside - 1] if inside else start


def _cut_in_order(logits, probs, ids, below, threshold):
    # Sort the few tokens at the cut by (logit, id); the cumulative sum starts from the mass under them.
    keys = order_keys(logits[ids], ids)
    p = probs[ids]
    if p.size > SORT_AT_MOST:  # all equally likely: the cumulative sums do not depend on their order
        cumulative = below + np.cumsum(np.full(p.size, p[0], dtype=np.float64))
        removed = int(np.count_nonzero(cumulative.astype(np.float32) <= threshold))
        if removed == p.size:
            return None  # a rounding edge between the bucket sums and this sum: the caller sorts the row
        first = np.partition(keys, removed)[removed]
    else:
        keys.sort()
        in_order = (keys & 0xFFFFFFFF).astype(np.intp)
        cumulative = below + np.cumsum(probs[in_order], dtype=np.float64)
        removed = int(np.count_nonzero(cumulative.astype(np.float32) <= threshold))
        if removed == p.size:
            return None
        first = keys[removed]
    logit = logits[first & 0xFFFFFFFF]
    tied = ids[(logits[ids] == logit) & (ids < (first & 0xFFFFFFFF))]
    return float(logit), tied


# How far from the cut a drawn token's mass must be for verdict() to answer without keeps(): far above every
# rounding between the two (float32 weights and probabilities, keeps()'s float64 sums, verdict's float32 pairwise
# sum of the mass below: under 1e-5 together).
SURE_MARGIN = 1e-3
SURE_TOKENS = 256  # verdict's largest gather: the tokens at or above one of at least 1/SURE_TOKENS of the weight
# The weights order the tokens as their logits do, up to rounding: float32 exp and its division by the total (a few
# units in the last place, 1e-7 each), a penalty's float64 factor rounded to float32, a temperature divided in
# float32 by NumPy. A token whose weight is within this fraction of the drawn one's may be on
# either side of it by logit, so verdict() counts it on whichever side makes its answer cautious.
ORDER_SLACK = 1e-5
_BELOW, _ABOVE = np.float32(1 - ORDER_SLACK), np.float32(1 + ORDER_SLACK)  # a weight's bounds, as float32 factors


def verdict(weights, total: float, token: int, p: float, work, flags) -> bool | None:
    """keeps()'s answer where the token is clearly inside or outside the cut, from the row's float32 weights alone;
    None within SURE_MARGIN of it (then ask keeps(), which needs the row's logits and probabilities).

    A larger weight means a larger logit, except between weights within ORDER_SLACK of each other, so every sum below
    bounds the mass keeps() adds up from the side that keeps the answer right. From above, for a token of at least 1/SURE_TOKENS of the
    row's weight (few tokens are at or above it): kept if the other tokens at or near its weight hold under p -
    SURE_MARGIN of the row. From below: kept if the clearly smaller weights hold over 1 - p + SURE_MARGIN (summed over
    ever longer prefixes of the row until they do); removed if every weight up to and near its own (the token and its
    ties included) holds under 1 - p - SURE_MARGIN. Reading the weights only, not the logits too, saves a pass over
    memory that the step has just left cold."""
    # [V] float32 weights (exp(logit - max), or probabilities), their float64 sum, token id, top_p, [V] float32 and
    # [V] bool to work in
    weight = weights[token]
    low, high = weight * _BELOW, weight * _ABOVE
    if weight * SURE_TOKENS >= total:
        np.greater_equal(weights, low, out=flags)
        mass = sum(weights[flags.nonzero()[0]].tolist()) - float(weight)  # Python floats: float64
        if mass < (p - SURE_MARGIN) * total:
            return True
    if _mass_below_exceeds(weights, low, (1 - p + SURE_MARGIN) * total, work, flags):
        return True
    np.less_equal(weights, high, out=flags)
    np.multiply(weights, flags, out=work)
    if float(np.add.reduce(work)) < (1 - p - SURE_MARGIN) * total:
        return False
    return None


# The prefixes of a row _mass_below_exceeds sums in turn, as fractions of the row. A token drawn from the whole row
# has half of the row's mass below its weight on average, so at p 0.9 a quarter of a flat row usually holds the
# 1 - p needed; each further prefix costs a few NumPy calls, more than the data they read right after a model step.
_PREFIXES = (1 / 4, 1 / 2, 1)


def _mass_below_exceeds(weights, low, need: float, work, flags) -> bool:
    """Whether the weights below `low` add up to more than `need`, summed over ever longer prefixes of the row (each
    sum a lower bound of the whole), so that a drawn token far above the cut reads a part of the row, not all of it.
    The float32 pairwise sums are within 1e-6 of float64 ones."""
    below, start = 0.0, 0
    for fraction in _PREFIXES:
        end = len(weights) if fraction == 1 else int(len(weights) * fraction)
        part, mask, product = weights[start:end], flags[start:end], work[start:end]
        np.less(part, low, out=mask)
        np.multiply(part, mask, out=product)
        below += float(np.add.reduce(product))  # float32, pairwise: ndarray.sum without its Python wrapper
        if below > need:
            return True
        start = end
    return False


def keeps(logits, probs64, threshold, token: int, mask=None) -> bool:
    """Whether transformers' top-p cut (before min_tokens_to_keep) keeps `token`, in one pass over the row.

    probs64: the row's float32 softmax as float64; mask: a [V] float64 array to work in, or None. The token's
    cumulative probability in the ascending (logit, id) order is the mass of every smaller logit, plus its ties
    up to it by id.
    """
    x = logits[token]
    mask = np.empty(probs64.size) if mask is None else mask
    # the probabilities of the smaller logits, 0 elsewhere: a product, not a gather (slow on a scattered mask),
    # and not np.dot (BLAS may start threads that fight onnxruntime's for the cores)
    np.multiply(probs64, logits < x, out=mask)
    tied = np.flatnonzero(logits == x)
    cumulative = mask.sum() + probs64[tied[tied <= token]].sum()
    return bool(np.float32(cumulative) > threshold)


# ---- top_p on whole rows, and the chain's draw from the nucleus ------------------------------------------------


def cut(out, p: float, min_tokens_to_keep: int = 1, ban: bool = True, scratch: Scratch | None = None) -> np.ndarray:
    """top_p on [B, V] logits in place; returns the pick's weights: exp(logit - max) of the tokens kept, else 0."""
    # ban: also set the removed tokens' logits to -inf (the chain's own pick needs only the weights).
    # A row whose softmax is undefined (all -inf, or +inf) is left as it is: pick handles it.
    scratch = scratch or Scratch()
    n_vocab, threshold = out.shape[-1], np.float32(1 - p)
    padded = draw.weights(out, scratch)
    probs, keep = scratch.get("probs", (n_vocab,), np.float32), scratch.get("keep", (n_vocab,), bool)
    work = scratch.get("bucket", (n_vocab,), np.intp), scratch.get("mass", (n_vocab,), np.float64)
    for r in range(out.shape[0]):
        w = padded[r, :n_vocab]
        total = w.sum()
        if not np.isfinite(total) or total == 0:
            continue
        np.divide(w, total, out=probs)  # float32, the softmax transformers sorts
        found = first_kept(out[r], probs, threshold, work)
        if found is None:
            keep[:] = _kept_by_sorting(out[r], probs, threshold, min_tokens_to_keep)
        else:
            logit, tied = found
            np.greater_equal(out[r], logit, out=keep)
            keep[tied] = False
            if min_tokens_to_keep > 1 and np.count_nonzero(keep) < min_tokens_to_keep:
                keep[:] = _kept_by_sorting(out[r], probs, threshold, min_tokens_to_keep)
        np.multiply(w, keep, out=w)
        if ban:
            _ban(out[r], keep, scratch.get("bound", (n_vocab,), np.float32))
    return padded


REJECT_FROM = 0.5  # top_p at least this large, last in the chain: drawn by rejection (draw_from)


def draw_from(out, p: float, rngs: list, scratch: Scratch) -> np.ndarray:
    """top_p then the pick, in one step, for p >= REJECT_FROM; the same distribution as cut() then draw.pick().

    Rejection sampling: draw from the whole row, keep the draw if the cut keeps that token, else draw again. The nucleus
    holds at least p of the mass, so at p >= 0.5 under two draws are needed on average, each tested in a pass over part
    or all of the row's weights (verdict; keeps, on its probabilities, for a token at the cut), where finding the cut
    takes a histogram and more. After draw.REJECTION_TRIES misses, the row's cut is found and drawn from: the
    distribution stays exact either way.
    """
    # [B, V] -> [B] int64
    if len(rngs) != out.shape[0]:
        raise ValueError(f"pick needs one random generator per row: got {len(rngs)} for {out.shape[0]} rows")
    n_vocab, threshold = out.shape[-1], np.float32(1 - p)
    found = draw.row_weights(out[0], scratch) if out.shape[0] == 1 else None
    if found is not None:  # one row, in fewer NumPy calls
        padded, ends = found[0][None], [found[1]]
    else:
        peak = out.max(axis=-1)  # NaN propagates: finite exactly when the row has no NaN or infinity at the top
        if not all(map(math.isfinite, peak.tolist())):  # a maximum of +inf or NaN (or all -inf)
            return draw.pick(out, True, rngs, cut(out, p, ban=False, scratch=scratch), scratch)  # the plain path copes
        if out.shape[0] < draw.MANY_ROWS:
            padded = draw.weights(out, scratch, peak, finite=True)
            ends = draw.block_ends(padded)
        else:  # the rows' weights on two threads; the running sums as running_totals adds them
            padded, sums = draw.weights_and_sums(out, scratch, peak)
            ends = np.cumsum(sums, axis=-1).tolist()
    work, flags = scratch.get("work", (n_vocab,), np.float32), scratch.get("flags", (n_vocab,), bool)
    picks = np.empty(out.shape[0], dtype=np.int64)
    for r, rng in enumerate(rngs):
        w, probs_of = padded[r, :n_vocab], None
        for _ in range(draw.REJECTION_TRIES):
            token = draw.search(padded[r], ends[r], rng.random(), n_vocab)
            kept = verdict(w, ends[r][-1], token, p, work, flags)
            if kept is None:  # at the cut: keeps() on the probabilities transformers' cut sums
                if probs_of is None:  # float32 division, stored as float64
                    probs_of = scratch.get("probs64", (n_vocab,), np.float64)
                    np.divide(w, w.sum(), out=probs_of, dtype=np.float32)
                kept = keeps(out[r], probs_of, threshold, token, scratch.get("mask", (n_vocab,), np.float64))
            if kept:
                picks[r] = token
                break
        else:
            row = out[r : r + 1].copy()
            picks[r] = draw.inverse_cdf(cut(row, p, ban=False), np.array([rng.random()]), n_vocab)[0]
    return picks


def _kept_by_sorting(logits, probs, threshold, min_tokens_to_keep) -> np.ndarray:
    # [V] -> [V] bool: the top-p cut by a stable sort of the whole row, for the cases nucleus.first_kept leaves out
    order = np.argsort(logits, kind="stable")
    kept_in_order = np.cumsum(probs[order], dtype=np.float64).astype(np.float32) > threshold
    kept_in_order[len(order) - min_tokens_to_keep :] = True
    keep = np.zeros(len(order), dtype=bool)
    keep[order[kept_in_order]] = True
    return keep


def _ban(row, keep, bound):
    # [V] float32, [V] bool, [V] float32 to work in: row[~keep] = -inf in place, without a branch per token (a
    # boolean-mask assignment costs ten times as much when the mask is scattered, as top_p's is on a flat row)
    np.subtract(keep, np.float32(0.5), out=bound)
    bound *= np.inf  # +inf where kept, -inf where removed
    np.minimum(row, bound, out=row)
