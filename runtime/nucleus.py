"""Where top-p (nucleus) sampling cuts one row of the vocabulary, found without sorting the row.

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
"""

import numpy as np

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
        cut, below = _crossing(np.bincount(bucket, weights=weights), below, threshold)
        if cut is None:
            return None
        inside = np.flatnonzero(bucket == cut)
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
