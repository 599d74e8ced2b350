"""Where top-p (nucleus) sampling cuts one row of the vocabulary, found without sorting the row.

transformers' TopPLogitsWarper sorts a row ascending by logit, takes the cumulative sum of its softmax and
removes every token whose cumulative probability is <= 1 - p. The removed tokens are therefore a prefix of the
ascending order, and one key says where it ends: the first token kept. Only the tokens near that cut need an
order. A log-scale histogram finds them in one pass: the float32 bit patterns of non-negative probabilities,
read as integers, sort like the values, so `(top - bits) >> shift` is a bucket index, 2^(23 - shift) buckets per
octave below the most likely token. np.bincount gives each bucket's mass; the bucket where the cumulative mass
crosses 1 - p is split the same way with finer buckets until it is small, and only it is sorted. The cost is
O(V) whatever the nucleus holds: a flat row (random weights: the nucleus is most of the vocabulary) costs what a
peaked one does, where a sort costs O(V log V).

Ties: tokens with equal logits have equal probabilities, so they always share a bucket, and the cut orders them
by token id, like a stable sort (torch's CPU sort is not stable, so transformers' choice among equal logits at
the cut depends on the row's length; the number of tokens kept is the same).
"""

import numpy as np

_SHIFTS = (17, 8, 0)  # bucket widths in float32 ulps at each level: 64 per octave, then 32,768, then exact values
_BUCKETS = 4096  # buckets per level: 64 octaves at the first; the last bucket also holds everything below
SORT_AT_MOST = 2048  # a set of tokens this small is sorted instead of split again


def order_keys(logits: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """One int64 per token that sorts like (logit, token id): the ascending order of a stable sort by logit."""
    # [n] float32, [n] int -> [n] int64
    bits = (logits + np.float32(0)).view(np.int32)  # + 0 turns -0.0 into 0.0: equal logits, equal keys
    ordered = bits ^ ((bits >> 31) & np.int32(0x7FFFFFFF))  # negative floats: flip the magnitude bits
    return (ordered.astype(np.int64) << 32) | ids.astype(np.int64)


def first_kept(logits: np.ndarray, probs: np.ndarray, threshold: np.float32) -> tuple[float, np.ndarray] | None:
    """Where transformers' top-p cut falls in one row, before min_tokens_to_keep.

    logits [V] float32 and probs = their softmax [V] float32 (all finite or 0); threshold = float32(1 - p).
    Returns (logit, ids): every token whose logit is below `logit` is removed, and so are the tokens `ids` (ties
    with it that come first by token id); every other token is kept. None when the cut removes every token.
    """
    below, ids, level = 0.0, None, 0  # the tokens under consideration (None: all) and the mass of those under them
    while True:
        p = probs if ids is None else probs[ids]
        bits = p.view(np.int32)
        top = bits.max()
        if p.size <= SORT_AT_MOST or bits.min() == top:
            return _cut_in_order(logits, probs, np.arange(p.size) if ids is None else ids, below, threshold)
        bucket = np.subtract(top, bits, dtype=np.intp)  # [n] 0 for the most likely token, growing downwards
        bucket >>= _SHIFTS[level]
        np.minimum(bucket, _BUCKETS - 1, out=bucket)
        mass = np.bincount(bucket, weights=p, minlength=_BUCKETS)  # [buckets] float64
        # cumulative probability after each bucket's last token, in ascending order: `below` + buckets >= d
        cumulative = below + np.cumsum(mass[::-1])[::-1]
        kept = int(np.count_nonzero(cumulative.astype(np.float32) > threshold))  # buckets 0 .. kept - 1
        if kept == 0:
            return None
        cut = kept - 1  # the bucket where the cumulative mass crosses 1 - p
        inside = np.flatnonzero(bucket == cut)
        ids = inside if ids is None else ids[inside]
        below = cumulative[cut + 1] if cut + 1 < _BUCKETS else below
        level += cut < _BUCKETS - 1  # the last bucket is split again at the same width, from its own top
        level = min(level, len(_SHIFTS) - 1)


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
