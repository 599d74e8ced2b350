"""Next-token selection: logits-to-logits filters in one fixed order, then one picker.

The chain (like llama.cpp's sampler chain; transformers' order where it has the same step):

    repetition_penalty -> frequency_presence_penalty -> logit_bias -> no_repeat_ngram
    -> bad_words -> min_new_tokens                       (always)
    -> temperature -> top_k -> top_p -> min_p -> typical_p   (only when do_sample)
    -> pick                                              (argmax, or one categorical draw per row)

Every filter maps float32 logits [B, V] to [B, V], has the parameter names and semantics of the
matching transformers 4.57 logits processor, and is a no-op at its GenerationConfig default.
A removed token gets -inf. Filters return a new array unless called with inplace=True
(process_logits copies once, then filters work in place on that copy).
Pure NumPy: the random generators are passed in, one per row, never global.
"""

import numpy as np

from .generation_config import GenerationConfig
from .errors import GenerationOptionError

NEG_INF = np.float32(-np.inf)
_NUCLEUS_CANDIDATES = 1024  # top_p first tries the 1,024 most likely tokens, then sorts the whole row


def _target(logits: np.ndarray, inplace: bool) -> np.ndarray:
    return logits if inplace else logits.copy()


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


def repetition_penalty(logits, seen: list[np.ndarray], penalty: float, *, inplace=False):
    """Penalize every token already seen in the row (prompt included): positive logits divided, negative multiplied.

    CTRL (Keskar et al., 2019); transformers' RepetitionPenaltyLogitsProcessor. penalty=1.0 is a no-op.
    """
    # [B, V] -> [B, V]
    out = _target(logits, inplace)
    if penalty == 1.0:
        return out
    for r, ids in enumerate(seen):
        ids = np.unique(_ids(ids))
        score = out[r, ids]
        out[r, ids] = np.where(score < 0, score * penalty, score / penalty)
    return out


def frequency_presence_penalty(
    logits, generated: list[np.ndarray], frequency_penalty: float, presence_penalty: float, *, inplace=False
):
    """Subtract frequency_penalty * count + presence_penalty * (count > 0) for each generated token (prompt excluded).

    OpenAI's API semantics. Both at 0.0 is a no-op.
    """
    # [B, V] -> [B, V]
    out = _target(logits, inplace)
    if frequency_penalty == 0 and presence_penalty == 0:
        return out
    for r, ids in enumerate(generated):
        ids, counts = np.unique(_ids(ids), return_counts=True)
        out[r, ids] -= (frequency_penalty * counts + presence_penalty).astype(out.dtype)
    return out


def logit_bias(logits, bias: dict[int, float], *, inplace=False):
    """Add bias[token] to that token's logit in every row (OpenAI's logit_bias). An empty dict is a no-op."""
    # [B, V] -> [B, V]
    out = _target(logits, inplace)
    if not bias:
        return out
    n_vocab = out.shape[-1]
    bad = sorted(t for t in bias if not 0 <= t < n_vocab)
    if bad:
        raise GenerationOptionError(
            f"logit_bias names token id(s) {bad} outside this model's vocabulary (ids 0 to {n_vocab - 1})"
        )
    ids = np.fromiter(bias.keys(), dtype=np.int64, count=len(bias))
    out[:, ids] += np.fromiter(bias.values(), dtype=out.dtype, count=len(bias))
    return out


def no_repeat_ngram(logits, seen: list[np.ndarray], n: int, *, inplace=False):
    """Ban every token that would complete an n-gram already present in the row (prompt included).

    Fairseq's no_repeat_ngram_size; transformers' NoRepeatNGramLogitsProcessor. n=0 is a no-op.
    """
    # [B, V] -> [B, V]
    out = _target(logits, inplace)
    if n <= 0:
        return out
    for r, ids in enumerate(seen):
        ids = _ids(ids)
        if len(ids) < n:
            continue
        grams = np.lib.stride_tricks.sliding_window_view(ids, n)  # [L - n + 1, n]
        match = (grams[:, :-1] == ids[len(ids) - n + 1 :]).all(axis=1)
        out[r, grams[match, -1]] = NEG_INF
    return out


def bad_words(logits, seen: list[np.ndarray], bad_words_ids: tuple[tuple[int, ...], ...], *, inplace=False):
    """Ban the last token of each bad sequence whose prefix ends the row; 1-long sequences are banned always.

    transformers' NoBadWordsLogitsProcessor. An empty tuple is a no-op.
    """
    # [B, V] -> [B, V]
    out = _target(logits, inplace)
    if not bad_words_ids:
        return out
    n_vocab = out.shape[-1]
    bad = sorted({t for word in bad_words_ids for t in word if not 0 <= t < n_vocab})
    if bad:
        raise GenerationOptionError(
            f"bad_words_ids names token id(s) {bad} outside this model's vocabulary (ids 0 to {n_vocab - 1})"
        )
    for word in bad_words_ids:
        prefix, last = word[:-1], word[-1]
        for r, ids in enumerate(seen):
            if not prefix or (len(ids) >= len(prefix) and np.array_equal(ids[len(ids) - len(prefix) :], prefix)):
                out[r, last] = NEG_INF
    return out


def min_new_tokens(logits, n_generated: int, min_new_tokens: int, eos_token_id: int | None, *, inplace=False):
    """Ban end-of-text while fewer than min_new_tokens tokens have been generated.

    transformers' MinNewTokensLengthLogitsProcessor. min_new_tokens=0 (or no eos id) is a no-op.
    """
    # [B, V] -> [B, V]
    out = _target(logits, inplace)
    if eos_token_id is not None and n_generated < min_new_tokens:
        out[:, eos_token_id] = NEG_INF
    return out


def temperature(logits, t: float, *, inplace=False):
    """Divide logits by t: below 1 sharpens, above 1 flattens. transformers' TemperatureLogitsWarper. t=1.0 is a no-op."""
    # [B, V] -> [B, V]
    out = _target(logits, inplace)
    if t != 1.0:
        np.divide(out, np.float32(t), out=out)
    return out


def top_k(logits, k: int, *, inplace=False):
    """Keep the k largest logits per row (ties with the k-th all kept). Fan et al., 2018; transformers' TopKLogitsWarper.

    k=0 (or k >= V) is a no-op.
    """
    # [B, V] -> [B, V]
    out = _target(logits, inplace)
    n_vocab = out.shape[-1]
    if k <= 0 or k >= n_vocab:
        return out
    kth = np.partition(out, n_vocab - k, axis=-1)[:, n_vocab - k, None]  # O(V), no full sort
    out[out < kth] = NEG_INF
    return out


def top_p(logits, p: float, min_tokens_to_keep: int = 1, *, inplace=False):
    """Nucleus sampling: keep the most likely tokens whose probability sums to p. Holtzman et al., 2019.

    transformers' TopPLogitsWarper exactly (sort ascending, remove tokens whose cumulative probability
    is <= 1 - p, always keep the min_tokens_to_keep largest). p=1.0 is a no-op.
    """
    # [B, V] -> [B, V]
    out = _target(logits, inplace)
    if p >= 1.0:
        return out
    probs = _softmax(out)
    cols = _candidates(out)  # tokens at -inf have probability 0: leaving them out changes no sum
    rest = 0.0  # probability of the tokens left out; in ascending order they all come first
    if cols is None and out.shape[-1] > 4 * _NUCLEUS_CANDIDATES and min_tokens_to_keep <= _NUCLEUS_CANDIDATES:
        # No full sort over V when the most likely tokens already hold more than p: every other token then
        # has a cumulative probability below 1 - p and is removed anyway.
        top = np.argpartition(out, -_NUCLEUS_CANDIDATES, axis=-1)[:, -_NUCLEUS_CANDIDATES:]
        top_mass = np.take_along_axis(probs, top, axis=-1).sum(axis=-1, dtype=np.float64)
        if (top_mass > p + 1e-4).all():
            cols, rest = top, 1.0 - top_mass[:, None]
    order = np.argsort(out if cols is None else np.take_along_axis(out, cols, axis=-1), axis=-1)
    cols = order if cols is None else np.take_along_axis(cols, order, axis=-1)  # [B, m], ascending logits
    cumulative = rest + np.cumsum(np.take_along_axis(probs, cols, axis=-1), axis=-1, dtype=np.float64)
    keep_sorted = cumulative.astype(np.float32) > (1 - p)
    keep_sorted[:, cols.shape[-1] - min_tokens_to_keep :] = True
    keep = np.zeros(out.shape, dtype=bool)
    np.put_along_axis(keep, cols, keep_sorted, axis=-1)
    out[~keep] = NEG_INF
    return out


def min_p(logits, p: float, *, inplace=False):
    """Drop tokens whose probability is below p times the top token's. Nguyen et al., 2024; transformers' MinPLogitsWarper.

    p=0.0 is a no-op. The most likely token is always kept.
    """
    # [B, V] -> [B, V]
    out = _target(logits, inplace)
    if p <= 0:
        return out
    probs = _softmax(out)
    out[probs < p * probs.max(axis=-1, keepdims=True)] = NEG_INF
    return out


def typical_p(logits, mass: float, *, inplace=False):
    """Locally typical sampling: keep tokens whose surprisal is closest to the entropy, up to total probability mass.

    Meister et al., 2022; transformers' TypicalLogitsWarper. mass=1.0 is a no-op.
    """
    # [B, V] -> [B, V]
    out = _target(logits, inplace)
    if mass >= 1.0:
        return out
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


def process_logits(logits, config: GenerationConfig, seen: list[np.ndarray], generated: list[np.ndarray]) -> np.ndarray:
    """Apply the whole filter chain of the module docstring; never modifies logits.

    seen[r]: row r's prompt and generated ids; generated[r]: its generated ids only.
    When no filter is active the input array itself is returned.
    """
    # [B, V] -> [B, V]
    c = config
    penalties = c.repetition_penalty != 1.0 or c.frequency_penalty != 0 or c.presence_penalty != 0 or c.logit_bias
    bans = c.no_repeat_ngram_size > 0 or c.bad_words_ids or (c.eos_token_id is not None and c.min_new_tokens > 0)
    warps = c.do_sample and (
        c.temperature != 1.0 or 0 < c.top_k < logits.shape[-1] or c.top_p < 1 or c.min_p > 0 or c.typical_p < 1
    )
    if not (penalties or bans or warps):
        return logits
    out = logits.copy()
    repetition_penalty(out, seen, c.repetition_penalty, inplace=True)
    frequency_presence_penalty(out, generated, c.frequency_penalty, c.presence_penalty, inplace=True)
    logit_bias(out, c.logit_bias, inplace=True)
    no_repeat_ngram(out, seen, c.no_repeat_ngram_size, inplace=True)
    bad_words(out, seen, c.bad_words_ids, inplace=True)
    for r, ids in enumerate(generated):
        min_new_tokens(out[r : r + 1], len(ids), c.min_new_tokens, c.eos_token_id, inplace=True)
    if c.do_sample:
        temperature(out, c.temperature, inplace=True)
        top_k(out, c.top_k, inplace=True)
        top_p(out, c.top_p, inplace=True)
        min_p(out, c.min_p, inplace=True)
        typical_p(out, c.typical_p, inplace=True)
    return out


def pick(logits, do_sample: bool, rngs: list[np.random.Generator]) -> np.ndarray:
    """Choose one token per row: argmax, or one draw from softmax(logits) with that row's own generator."""
    # [B, V] -> [B] int64
    best = logits.argmax(axis=-1)
    dead = np.flatnonzero(logits[np.arange(logits.shape[0]), best] == NEG_INF)
    if dead.size:
        raise GenerationOptionError(
            f"every token was banned for row(s) {dead.tolist()}: loosen bad_words_ids, no_repeat_ngram_size or logit_bias"
        )
    if not do_sample:
        return best.astype(np.int64)
    if len(rngs) != logits.shape[0]:
        raise ValueError(f"pick needs one random generator per row: got {len(rngs)} for {logits.shape[0]} rows")
    weights = np.exp(logits - logits.max(axis=-1, keepdims=True))  # [B, V] unnormalized; -inf -> 0
    positive = weights > 0
    picks = np.empty(logits.shape[0], dtype=np.int64)
    for r, rng in enumerate(rngs):
        alive = np.flatnonzero(positive[r])  # usually few after top_k: the cumulative sum is then short
        cdf = np.cumsum(weights[r, alive], dtype=np.float64)
        picks[r] = alive[min(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"), len(alive) - 1)]
    return picks


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
