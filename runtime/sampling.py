"""Next-token selection: logits-to-logits filters in one fixed order, then one picker.

The chain (like llama.cpp's sampler chain; transformers' order where it has the same step):

    repetition_penalty -> frequency_presence_penalty -> logit_bias -> no_repeat_ngram
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
the vocabulary. When top_p or top_k is the last
filter, the chain draws from the tokens it keeps instead of writing -inf over the rest of the row.
"""

import functools
import math
from dataclasses import replace

import numpy as np

from . import draw, nucleus, topk
from .draw import BLOCK, FEW_ALIVE, Prepared, Scratch, draw_rows, pick, search
from .generation_config import GenerationConfig, check_token_ids
from .tally import SeenTally, Tallies

NEG_INF = np.float32(-np.inf)
__all__ = ["SamplerChain", "process_logits", "pick", "log_softmax", "top_logprobs"]  # pick: from draw.py
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
    is <= 1 - p, always keep the min_tokens_to_keep largest), found without sorting the row (runtime/nucleus.py);
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


class SamplerChain:
    """One request's next-token choice: its active filters in the order of the module docstring, then the pick.

    Built once per request. Calling it takes the rows' raw logits [B, V], their seen ids (prompt and
    generated) and generated ids, and one random generator per row; it returns one token id per row.
    The penalties, when active, are applied together (the generated ids are among the seen ones): one read and one
    write of each row's seen ids, with the same arithmetic, in the same order, as the two filters one after the
    other. When they are the only filters that write (the pick, or a last top_k or top_p, only reads), the chain
    writes them into the caller's logits, picks, and writes the saved logits back, instead of copying the row.
    """

    def __init__(self, config: GenerationConfig, vocab_size: int):
        if config.vocab_size != vocab_size:
            config = replace(config, vocab_size=vocab_size)  # its token ids are checked here, once
        c = config
        candidates = [
            (repetition_penalty, c.repetition_penalty),
            (frequency_presence_penalty, c.frequency_penalty, c.presence_penalty),
            (logit_bias, c.logit_bias),
            (no_repeat_ngram, c.no_repeat_ngram_size),
            (bad_words, c.bad_words_ids),
            (min_new_tokens, c.min_new_tokens, c.eos_token_id),
        ]
        if c.do_sample:  # the warpers shape the distribution a draw comes from; they never move the argmax
            candidates += [(temperature, c.temperature), (top_k, c.top_k), (top_p, c.top_p), (min_p, c.min_p)]
            candidates += [(typical_p, c.typical_p)]
        self.filters = [(f, tuple(options)) for f, *options in candidates if not f.no_op(*options)]
        self.do_sample = c.do_sample
        # no active filter bans a token: the pick need not look for rows with few tokens left
        self.dense = vocab_size > FEW_ALIVE and all(f in NEVER_BAN for f, _ in self.filters)
        self.scratch = Scratch()  # the arrays each step works in, kept for the next step
        self.seen_ids, self.generated_counts = Tallies(), Tallies()  # what the penalties read, kept up to date
        active = dict(self.filters)
        self.penalties = sum(f in PENALTIES for f in active)  # how many of the first filters are penalties
        self.factor = _penalty_factor(*active[repetition_penalty]) if repetition_penalty in active else None
        weigh = None
        if frequency_presence_penalty in active:  # each generated id's offset, kept up to date by its tally
            frequency, presence = active[frequency_presence_penalty]
            weigh = functools.partial(_generated_offset, frequency=frequency, presence=presence)
        self.seen_tallies = Tallies(functools.partial(SeenTally, weigh=weigh))
        writers = self.filters[:-1] if self.filters and self.filters[-1][0] in READ_ONLY_LAST else self.filters
        self.restores = bool(writers) and len(writers) == self.penalties  # penalties in place, then restored
        # A graph's sampling outputs (draw.Prepared) serve the pick when only the penalties and the temperature write
        # before it and it is the plain draw or top_p's rejection draw: the temperature they must be made at, or None.
        last_p = active[top_p][0] if self.filters and self.filters[-1][0] is top_p else None
        body = self.filters[:-1] if last_p is not None else self.filters
        plain_or_rejection = last_p is None or last_p >= nucleus.REJECT_FROM
        # The penalties never raise a logit: a weight the graph made 0 (far under the row's maximum) stays right,
        # and the plain draw may keep or refuse the prepared weights' draws instead of reweighing (_draw_penalized).
        offsets = active.get(frequency_presence_penalty, (0, 0))
        lowers = (self.factor is None or self.factor >= 1) and min(offsets) >= 0
        in_range = np.finfo(np.float32).tiny < c.temperature < F32_MAX  # a float32 the graph divides by
        serves = c.do_sample and in_range and lowers and plain_or_rejection and all(f in NEVER_BAN for f, _ in body)
        self.prepared_temperature = float(np.float32(c.temperature)) if serves else None
        self.top_p_last = last_p

    def __call__(self, logits, seen: list, generated: list, rngs: list, prepared: Prepared | None = None) -> np.ndarray:
        """seen[r], generated[r]: row r's ids lists. The chain follows each list object as it grows between calls
        (the decode loop appends to it), so a list may only grow at its end; a new list object is counted anew.
        prepared: the graph's sampling outputs for these rows, when it has them (the chain uses them where they
        serve, and may change them). The logits are as they were when it returns."""
        # [B, V] -> [B] int64
        if prepared is not None and self.prepared_temperature is not None:
            picks = self._pick_prepared(logits, seen, generated, rngs, prepared)
            if picks is not None:
                return picks
        if self.restores and logits.flags.writeable:
            saved = self._penalize(logits, seen, generated)
            if saved is not None:
                try:
                    return self._pick(logits, self.filters[self.penalties :], rngs)
                finally:
                    _put_back(logits, saved)
        last = self.filters[-1][0] if self.filters else None
        if len(self.filters) > (last in READ_ONLY_LAST):  # the filters before a last top_k or top_p write: a copy
            out = self.scratch.get("logits", logits.shape, logits.dtype)
            np.copyto(out, logits)
            rest = self.filters[-1:] if last in READ_ONLY_LAST else []
            return self._pick(
                self._apply(out, self.filters[: len(self.filters) - len(rest)], seen, generated), rest, rngs
            )
        return self._pick(logits, self.filters, rngs)

    def _pick(self, out, rest: list, rngs: list) -> np.ndarray:
        # the pick after every filter but `rest`: nothing, or a last top_k or top_p, which only reads out
        if not rest:
            return pick(out, self.do_sample, rngs, scratch=self.scratch, dense=self.dense)
        last, options = rest[0]
        if last is top_k:  # draw from the tokens it keeps: no -inf written over the rest
            return topk.draw_kept(out, options[0], rngs)
        (p,) = options
        if p >= nucleus.REJECT_FROM:
            return nucleus.draw_from(out, p, rngs, self.scratch)
        given = nucleus.cut(out, p, ban=False, scratch=self.scratch)  # the pick reuses its exp(logits - max)
        return pick(out, self.do_sample, rngs, given, self.scratch)

    def _pick_prepared(self, logits, seen: list, generated: list, rngs: list, prepared: Prepared) -> np.ndarray | None:
        """The pick from the graph's sampling outputs, the penalties' tokens reweighed or their draws kept or refused;
        None, with the logits as they were, where they do not serve (made at another temperature, a row's total
        refused by Prepared.row_ends, logits the penalties cannot be written into): the caller then computes as
        usual, from generators that may have been used."""
        rows = logits.shape[0]
        if len(rngs) != rows or len(prepared.temperatures) != rows or len(prepared.weights) != rows:
            return None
        if any(t != self.prepared_temperature for t in prepared.temperatures):
            return None
        if self.penalties and self.top_p_last is None:
            return self._draw_penalized(logits, seen, generated, rngs, prepared)
        saved = []
        if self.penalties:
            saved = self._penalize(logits, seen, generated) if logits.flags.writeable else None
            if saved is None:
                return None
        try:
            for row, (ids, values, penalized) in enumerate(saved):
                _reweigh(prepared, row, ids, values, penalized)
            ends = prepared.ends()
            if ends is None:
                return None
            if self.top_p_last is None:
                return draw_rows(prepared.weights, ends, rngs, logits.shape[-1])

            t, row_of, slack = self.prepared_temperature, None, nucleus.ORDER_SLACK
            if t != 1:

                def row_of(r):  # the cut, where the weights leave it open, is decided on the tempered logits
                    return temperature.apply(logits[r : r + 1].copy(), t)[0]

                slack = max([slack] + [_reweigh_slack(values, penalized, t) for _, values, penalized in saved])
            return nucleus.draw_from(
                logits, self.top_p_last, rngs, self.scratch, (prepared.weights, ends), row_of, slack
            )
        finally:
            _put_back(logits, saved)

    def process(self, logits, seen: list, generated: list) -> np.ndarray:
        """The filtered logits: a copy, or the input itself when no filter is active."""
        # [B, V] -> [B, V]
        if not self.filters:
            return logits
        return self._apply(logits.copy(), self.filters, seen, generated)

    def _draw_penalized(self, logits, seen: list, generated: list, rngs: list, prepared: Prepared) -> np.ndarray | None:
        """The plain draw after the penalties (which only lower logits), by rejection: draw from the prepared
        weights, and keep a token the penalties changed with probability exp((penalized - logit) / t), the share of
        its weight they leave (<= 1), else draw again. After draw.REJECTION_TRIES misses, the row's weights are
        reweighed and drawn from: the same distribution either way, and an unchanged token costs no second uniform.
        None where the prepared weights do not serve (the generators may have been used): the caller computes from
        the logits."""
        rows = self.seen_tallies.update(seen, generated)
        ends = prepared.ends()
        if ends is None or any(row is None for row in rows):
            return None
        n_vocab, picks = logits.shape[-1], []
        for r, (rng, tally, (ids, offsets)) in enumerate(zip(rngs, self.seen_tallies.latest, rows)):
            weights, t = prepared.weights[r], prepared.temperatures[r]
            for _ in range(draw.REJECTION_TRIES):
                token = search(weights, ends[r], rng.random(), n_vocab)
                index = tally.index(token)
                if index is None:
                    break
                before = logits[r, token : token + 1]
                with np.errstate(over="ignore", invalid="ignore"):  # see _repeated
                    after = self._penalized(before, None if offsets is None else offsets[index : index + 1])
                change = float(after[0]) - float(before[0])
                if change == 0 or rng.random() < math.exp(change / t):
                    break
            else:  # the penalized tokens hold most of the row: reweigh it
                values = logits[r].take(ids)
                with np.errstate(over="ignore", invalid="ignore"):
                    _reweigh(prepared, r, ids, values, self._penalized(values, offsets))
                row_ends = prepared.row_ends(r)
                if row_ends is None:
                    return None
                token = search(weights, row_ends, rng.random(), n_vocab)
            picks.append(token)
        return np.array(picks, dtype=np.int64)

    def _penalize(self, out, seen: list, generated: list) -> list | None:
        """Both penalties (those active) on out in place; per row, the logits they replaced and the ones they wrote
        ([n] ids, [n] logits, [n] penalized).
        None, with out untouched, when a row's generated ids are not all among its seen ids, or out is not float32
        (the logits' dtype in the graph contract; the fused arithmetic rounds to float32)."""
        if out.dtype != np.float32:
            return None
        rows = self.seen_tallies.update(seen, generated)
        if any(row is None for row in rows):
            return None
        saved = []
        try:
            with np.errstate(over="ignore", invalid="ignore"):  # see _repeated
                for row, (ids, offsets) in zip(out, rows):  # take and put: out[r, ids], without indexing machinery
                    values = row.take(ids)  # a copy: what the caller's logits get back
                    penalized = self._penalized(values, offsets)
                    row.put(ids, penalized)
                    saved.append((ids, values, penalized))
        except BaseException:  # an id past the vocabulary, say: the rows done so far get their logits back
            _put_back(out, saved)
            raise
        return saved

    def _penalized(self, values: np.ndarray, offsets: np.ndarray | None) -> np.ndarray:
        """Both penalties (those active) on the logits `values` of seen ids, float32, with their offsets (0 for an id
        never generated; None without the frequency and presence penalties), rounded to float32. Call it under
        np.errstate(over="ignore", invalid="ignore"): see _repeated."""
        if self.factor is None:
            return values - offsets  # x - 0 is x, -0 and -inf included
        if offsets is None:
            return _repeated(values, self.factor).astype(np.float32)
        # rounded to float32, then the float32 subtraction: the two filters' arithmetic, in order
        return np.subtract(_repeated(values, self.factor), offsets, dtype=np.float32)

    def _apply(self, out, filters, seen: list, generated: list) -> np.ndarray:
        if filters and filters[0][0] in PENALTIES and self._penalize(out, seen, generated) is not None:
            filters = filters[self.penalties :]
        for f, options in filters:
            if f.reads == COUNT:  # min_new_tokens: each row has its own count
                for r, ids in enumerate(generated):
                    f.apply(out[r : r + 1], len(ids), *options)
                continue
            if f.reads == SEEN_IDS:  # the distinct ids: the same result as every copy, counted once
                history = ([ids for ids, _ in self.seen_ids.update(seen)],)
            elif f.reads == GENERATED_COUNTS:
                history = (self.generated_counts.update(generated),)
            else:
                history = (seen,) if f.reads == SEEN else ()
            f.apply(out, *history, *options)
        return out


def _reweigh(prepared: Prepared, row: int, ids: np.ndarray, before: np.ndarray, after: np.ndarray) -> None:
    """The penalties in one row of prepared weights: each token of `ids` weighed by exp((after - before) / t), its
    logit's change at the row's temperature t (<= 0: they only lower logits), and the sums of the blocks they are in
    added up again. A change from -inf (-inf - -inf is NaN) leaves a total that Prepared.row_ends refuses: the chain
    then computes from the logits."""
    weights, t = prepared.weights[row], prepared.temperatures[row]
    with np.errstate(over="ignore", invalid="ignore"):  # damaged weights (NaN, past float32's range): refused later
        change = np.subtract(after, before, dtype=np.float64)
        if t != 1:
            change /= t
        weights.put(ids, weights.take(ids) * np.exp(change, out=change))
        in_blocks = weights.reshape(-1, BLOCK)
        if 4 * len(ids) > len(in_blocks):  # many blocks: all of them in one pass
            np.sum(in_blocks, axis=1, out=prepared.block_sums[row])
        else:  # each id's block (a block with several is summed again for each: the same sum)
            blocks = ids // BLOCK
            prepared.block_sums[row].put(blocks, in_blocks[blocks].sum(axis=1))


def _reweigh_slack(values: np.ndarray, penalized: np.ndarray, t: float) -> float:
    """How far out of the tempered logits' order _reweigh can leave a row's weights, as a fraction of a weight.

    At a temperature the graph's weight of a penalized token is exp(float32(logit / t) + (penalized - logit) / t),
    while the cut orders it by float32(penalized / t): the two exponents differ by up to one float32 spacing at
    the larger of |logit / t| and |penalized / t| (1.5e-5 around 100), more than nucleus.ORDER_SLACK allows for."""
    if not len(values):
        return 0.0
    with np.errstate(over="ignore", invalid="ignore"):
        largest = np.float32(max(np.abs(values).max(), np.abs(penalized).max()) / t)
    return 4 * float(np.spacing(largest)) if np.isfinite(largest) else 1.0


def _put_back(out, saved: list) -> None:
    """Write the logits _penalize saved back into the rows it changed (the first len(saved) rows of out)."""
    for row, (ids, values, _) in zip(out, saved):
        row.put(ids, values)


def process_logits(logits, config: GenerationConfig, seen: list[np.ndarray], generated: list[np.ndarray]) -> np.ndarray:
    """Apply the whole filter chain of the module docstring once; never modifies logits.

    seen[r]: row r's prompt and generated ids; generated[r]: its generated ids only.
    When no filter is active the input array itself is returned.
    """
    # [B, V] -> [B, V]
    return SamplerChain(config, logits.shape[-1]).process(logits, seen, generated)


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
