"""Next-token selection: logits-to-logits filters in one fixed order, then one picker.

The chain (like llama.cpp's sampler chain; transformers' order where it has the same step):

    constraint                                               (a constrained row: constraint.py's mask)
    -> repetition_penalty -> frequency_presence_penalty -> logit_bias -> no_repeat_ngram
    -> bad_words -> min_new_tokens                           (always)
    -> temperature -> top_k -> top_p -> min_p -> typical_p   (only when do_sample)
    -> pick                                                  (argmax, or one categorical draw per row)

A SamplerChain is built once per request from its GenerationConfig and holds only the active filters:
each filter declares, in its @logits_filter line, which option values turn it off, and that declaration is
the one place the no-op values are written. Every filter maps float32 logits [B, V] to [B, V], has the
parameter names and semantics of the matching transformers 4.57 logits processor, and never makes NaN or
+inf from finite logits (a value past float32's range upwards is clipped to its largest; downwards it is
-inf, a probability of 0 either way). A removed token gets -inf. Called
directly, a filter returns a new array unless called with inplace=True; the chain copies once and works in
place, or, when the penalties are the only filters that write, applies them to the caller's logits and puts the
replaced values back after the pick (see SamplerChain). Pure NumPy: the random generators are passed in, one
per row, never global. The pick lives in draw.py, top_p's machinery in nucleus.py, top_k's in topk.py; none sorts
the vocabulary. When top_p or top_k is the last filter, the chain (chain.py) draws from the tokens it keeps
instead of writing -inf over the rest of the row.

The constraint comes first: a constrained row's forbidden tokens are -inf before any other filter sees the row, for
greedy and every sampling setting alike, so the distribution drawn from (and the log-probs reported) is the
model's renormalized over the tokens the grammar allows. It is per step and per row (a bitmask the grammar's matcher
computes, constraint.py), not an option, so it is applied by SamplerChain.constrain, in place, before the call.
"""

import functools

import numpy as np

from ..generation_config import check_token_ids
from . import nucleus, topk

NEG_INF = np.float32(-np.inf)
F32_MAX = np.finfo(np.float32).max

# The history a filter reads after the logits: each row's prompt and generated ids in order (SEEN); the same ids
# in any order, repeats optional (SEEN_IDS); its generated ids, distinct, with how often each was generated
# ([n] int64, [n] int64) (GENERATED_COUNTS); or how many tokens it has generated (COUNT). A direct call takes the
# ids lists for all of them but COUNT; the chain keeps SEEN_IDS and GENERATED_COUNTS up to date as rows grow.
SEEN, SEEN_IDS, GENERATED_COUNTS, COUNT = "seen", "seen ids", "generated counts", "count"


def logits_filter(no_op, reads=None, token_ids=None):
    """Declare a filter `apply(out, [history,] *options)` that works in place and returns `out`.

    no_op(*options) is true for the option values that turn the filter off: the chain leaves it out, and a
    direct call returns the logits unchanged. reads: SEEN, GENERATED, COUNT or None (see above).
    token_ids: (option name, options -> the ids they name), checked against the vocabulary on a direct
    call (a GenerationConfig checks its own ids once, when it is built).
    """

    def declare(apply):
        @functools.wraps(apply)
        def call(logits, *args, inplace=False, **keywords):
            # [B, V] -> [B, V]
            out = logits if inplace else logits.copy()
            options = args[1:] if reads is not None else args
            if no_op(*options, **keywords):
                return out
            if token_ids is not None:
                check_token_ids(token_ids[0], token_ids[1](*options), out.shape[-1])
            if reads == GENERATED_COUNTS:
                args = ([np.unique(_ids(ids), return_counts=True) for ids in args[0]], *args[1:])
            return apply(out, *args, **keywords)

        call.no_op, call.reads, call.apply = no_op, reads, apply
        return call

    return declare


def _softmax(logits: np.ndarray) -> np.ndarray:
    # [B, V] -> [B, V] float32; -inf -> 0; a row of all -inf gives NaN, kept out of every filter's sets
    with np.errstate(invalid="ignore"):
        e = np.exp(logits - logits.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)


def _ids(ids) -> np.ndarray:
    return np.asarray(ids, dtype=np.int64)  # an empty list would otherwise become float64, not an index


def _candidates(logits: np.ndarray) -> np.ndarray | None:
    # [B, V] -> [B, m] or None (all V): columns covering every logit above -inf in every row (m = the most in one row).
    # Earlier filters (top_k, bad words) often leave few tokens alive: later sorts then cost m, not V.
    # (np.argpartition is no help here: it slows down tenfold on a row full of equal -inf values.)
    alive = ~np.isneginf(logits)
    m = int(alive.sum(axis=-1).max())
    if m == 0 or m > logits.shape[-1] // 2:
        return None  # not worth it: use every column
    cols = np.repeat(logits.argmin(axis=-1)[:, None], m, axis=1)  # padding points at one of the row's -inf
    for r, row in enumerate(alive):
        row_cols = np.flatnonzero(row)
        cols[r, : len(row_cols)] = row_cols
    return cols


@functools.lru_cache(maxsize=64)
def _penalty_factor(penalty: float) -> np.float64:
    # float32 arithmetic as transformers does it (exact in float64, then rounded once), except for a penalty
    # below float32's range, which would become 0. Cached: a request asks for it every step, and right after a
    # model step even these scalar conversions cost tens of microseconds (their code is out of the caches).
    with np.errstate(over="ignore"):
        factor = np.float32(penalty)
    return np.float64(factor if factor > 0 else penalty)


def _repeated(values: np.ndarray, factor: np.float64) -> np.ndarray:
    # [n] float32 logits -> [n] float64 penalized, clipped at float32's largest: repetition_penalty's arithmetic,
    # exact in float64 and rounded once by the caller's float32 store (under np.errstate(over="ignore",
    # invalid="ignore"): below float32's range is -inf, and 0 * inf is computed in the branch np.where drops)
    score = values.astype(np.float64)
    penalized = np.where(score < 0, score * factor, score / factor)
    return np.minimum(penalized, F32_MAX, out=penalized)


def _generated_offset(counts, frequency: float, presence: float):
    # counts (an int, or an int64 array, each > 0) -> what frequency_presence_penalty subtracts, float64 (rounded
    # to float32 by the caller): the one place its formula is written, for the direct filter and the chain's tally
    return frequency * counts + presence


@logits_filter(no_op=lambda penalty: penalty == 1.0, reads=SEEN_IDS)
def repetition_penalty(out, seen: list[np.ndarray], penalty: float):
    """Penalize every token already seen in the row (prompt included): positive logits divided, negative multiplied.

    CTRL (Keskar et al., 2019); transformers' RepetitionPenaltyLogitsProcessor. penalty=1.0 is a no-op.
    """
    # [B, V] -> [B, V]
    factor = _penalty_factor(penalty)
    with np.errstate(over="ignore", invalid="ignore"):
        for r, ids in enumerate(seen):
            ids = _ids(ids)  # repeats need no np.unique: every copy of an id is given the same new value
            out[r, ids] = _repeated(out[r, ids], factor)
    return out


@logits_filter(no_op=lambda frequency, presence: frequency == 0 and presence == 0, reads=GENERATED_COUNTS)
def frequency_presence_penalty(out, generated: list, frequency_penalty: float, presence_penalty: float):
    """Subtract frequency_penalty * count + presence_penalty * (count > 0) for each generated token (prompt excluded).

    OpenAI's API semantics. Both at 0.0 is a no-op.
    """
    # [B, V] -> [B, V]
    for r, (ids, counts) in enumerate(generated):
        out[r, ids] -= _generated_offset(counts, frequency_penalty, presence_penalty).astype(out.dtype)
    return out


@logits_filter(no_op=lambda bias: not bias, token_ids=("logit_bias", lambda bias: bias))
def logit_bias(out, bias: dict[int, float]):
    """Add bias[token] to that token's logit in every row (OpenAI's logit_bias). An empty dict is a no-op."""
    # [B, V] -> [B, V]
    ids = np.fromiter(bias.keys(), dtype=np.int64, count=len(bias))
    with np.errstate(over="ignore"):  # a bias past float32's range: +inf is clipped below, -inf bans the token
        values = np.fromiter(bias.values(), dtype=out.dtype, count=len(bias))
        out[:, ids] = np.minimum(out[:, ids] + values, F32_MAX)
    return out


@logits_filter(no_op=lambda n: n <= 0, reads=SEEN)
def no_repeat_ngram(out, seen: list[np.ndarray], n: int):
    """Ban every token that would complete an n-gram already present in the row (prompt included).

    Fairseq's no_repeat_ngram_size; transformers' NoRepeatNGramLogitsProcessor. n=0 is a no-op.
    """
    # [B, V] -> [B, V]
    for r, ids in enumerate(seen):
        ids = _ids(ids)
        if len(ids) < n:
            continue
        grams = np.lib.stride_tricks.sliding_window_view(ids, n)  # [L - n + 1, n]
        match = (grams[:, :-1] == ids[len(ids) - n + 1 :]).all(axis=1)
        out[r, grams[match, -1]] = NEG_INF
    return out


@logits_filter(
    no_op=lambda words: not words, reads=SEEN, token_ids=("bad_words_ids", lambda words: {t for w in words for t in w})
)
def bad_words(out, seen: list[np.ndarray], bad_words_ids: tuple[tuple[int, ...], ...]):
    """Ban the last token of each bad sequence whose prefix ends the row; 1-long sequences are banned always.

    transformers' NoBadWordsLogitsProcessor. An empty tuple is a no-op.
    """
    # [B, V] -> [B, V]
    for word in bad_words_ids:
        prefix, last = word[:-1], word[-1]
        for r, ids in enumerate(seen):
            if not prefix or (len(ids) >= len(prefix) and np.array_equal(ids[len(ids) - len(prefix) :], prefix)):
                out[r, last] = NEG_INF
    return out


@logits_filter(no_op=lambda minimum, eos_token_id: minimum <= 0 or eos_token_id is None, reads=COUNT)
def min_new_tokens(out, n_generated: int, min_new_tokens: int, eos_token_id: tuple | None):
    """Ban end-of-text (every eos id) while fewer than min_new_tokens tokens have been generated.

    transformers' MinNewTokensLengthLogitsProcessor. min_new_tokens=0 (or no eos id) is a no-op.
    """
    # [B, V] -> [B, V]
    if n_generated < min_new_tokens:
        out[:, list(eos_token_id)] = NEG_INF
    return out


@logits_filter(no_op=lambda t: t == 1.0)
def temperature(out, t: float):
    """Divide logits by t: below 1 sharpens, above 1 flattens. transformers' TemperatureLogitsWarper. t=1.0 is a no-op.

    A row that a tiny t would push past float32's range is shifted by its maximum first: softmax ignores a
    shift, so every later filter and the pick see the same distribution (for t -> 0, the argmax).
    """
    # [B, V] -> [B, V]
    overflow = None
    if t < 1.0:  # dividing by t >= 1 only shrinks the logits
        peak = np.max(np.abs(out), axis=-1, where=np.isfinite(out), initial=0.0)  # [B]
        overflow = np.flatnonzero(peak.astype(np.float64) / t > F32_MAX)
    if overflow is not None and overflow.size:
        rows = out[overflow].astype(np.float64)
        shifted = (rows - rows.max(axis=-1, keepdims=True)) / t  # <= 0 everywhere, 0 at the maximum
        with np.errstate(over="ignore"):
            out[overflow] = shifted  # past float32's range: -inf, a probability of 0 either way
        rest = np.setdiff1d(np.arange(out.shape[0]), overflow)
        out[rest] /= np.float32(t)
    else:
        np.divide(out, np.float32(t), out=out)
    return out


@logits_filter(no_op=lambda k: k <= 0)
def top_k(out, k: int):
    """Keep the k largest logits per row (ties with the k-th all kept). Fan et al., 2018; transformers' TopKLogitsWarper.

    k=0 is a no-op (and so is any k >= V: nothing to remove).
    """
    # [B, V] -> [B, V]
    if k >= out.shape[-1]:
        return out
    for row in out:
        ids, values = topk.kept(row, k)  # usually found without partitioning the row
        row.fill(NEG_INF)
        row[ids] = values
    return out


@logits_filter(no_op=lambda p, min_tokens_to_keep=1: p >= 1.0)
def top_p(out, p: float, min_tokens_to_keep: int = 1):
    """Nucleus sampling: keep the most likely tokens whose probability sums to p. Holtzman et al., 2019.

    transformers' TopPLogitsWarper exactly (sort ascending, remove tokens whose cumulative probability
    is <= 1 - p, always keep the min_tokens_to_keep largest), found without sorting the row (runtime/sampling/nucleus.py);
    equal logits at the cut are taken in token id order, as a stable sort takes them. p=1.0 is a no-op.
    """
    # [B, V] -> [B, V]
    nucleus.cut(out, p, min_tokens_to_keep)
    return out


@logits_filter(no_op=lambda p: p <= 0)
def min_p(out, p: float):
    """Drop tokens whose probability is below p times the top token's. Nguyen et al., 2024; transformers' MinPLogitsWarper.

    p=0.0 is a no-op. The most likely token is always kept.
    """
    # [B, V] -> [B, V]
    probs = _softmax(out)
    out[probs < p * probs.max(axis=-1, keepdims=True)] = NEG_INF
    return out


@logits_filter(no_op=lambda mass: mass >= 1.0)
def typical_p(out, mass: float):
    """Locally typical sampling: keep tokens whose surprisal is closest to the entropy, up to total probability mass.

    Meister et al., 2022; transformers' TypicalLogitsWarper. mass=1.0 is a no-op.
    """
    # [B, V] -> [B, V]
    cols = _candidates(out)
    cols = np.broadcast_to(np.arange(out.shape[-1]), out.shape) if cols is None else cols
    cand = np.take_along_axis(out, cols, axis=-1)  # [B, m]
    logp = log_softmax(cand)
    with np.errstate(invalid="ignore"):  # -inf * 0 at banned tokens: nansum skips them, as torch's does
        entropy = -np.nansum(logp * np.exp(logp), axis=-1, keepdims=True)
        shifted = np.abs(-logp - entropy)
    order = np.argsort(shifted, axis=-1)
    shifted, cols = np.take_along_axis(shifted, order, axis=-1), np.take_along_axis(cols, order, axis=-1)
    cumulative = np.cumsum(_softmax(np.take_along_axis(cand, order, axis=-1)), axis=-1, dtype=np.float64).astype(
        np.float32
    )
    last = np.minimum((cumulative < mass).sum(axis=-1), shifted.shape[-1] - 1)
    remove = shifted > np.take_along_axis(shifted, last[:, None], axis=-1)
    remove[:, 0] = False
    rows = np.broadcast_to(np.arange(out.shape[0])[:, None], cols.shape)
    out[rows[remove], cols[remove]] = NEG_INF
    return out


NEVER_BAN = (repetition_penalty, frequency_presence_penalty, temperature)  # move logits, never to -inf on purpose
PENALTIES = (repetition_penalty, frequency_presence_penalty)  # applied together by the chain: the same ids
READ_ONLY_LAST = (top_k, top_p)  # as the chain's last filter, only read: the chain draws from what they keep


def log_softmax(logits) -> np.ndarray:
    """Numerically stable log-probabilities per row."""
    # [B, V] -> [B, V] float32
    logits = np.asarray(logits, dtype=np.float32)
    with np.errstate(invalid="ignore"):  # a row of all -inf gives NaN
        shifted = logits - logits.max(axis=-1, keepdims=True)
        return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def top_logprobs(logprobs_row, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The n most likely token ids of one row and their log-probabilities, most likely first."""
    # [V] -> ([n] int64, [n] float32)
    n = min(max(n, 0), len(logprobs_row))
    if n == 0:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=logprobs_row.dtype)
    ids = np.argpartition(logprobs_row, len(logprobs_row) - n)[len(logprobs_row) - n :]
    ids = ids[np.argsort(-logprobs_row[ids], kind="stable")].astype(np.int64)
    return ids, logprobs_row[ids]
