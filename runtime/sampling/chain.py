"""The sampler chain: a request's active filters (filters.py) in their fixed order, then one pick (draw.py).

A SamplerChain is built once per request from its GenerationConfig and holds only the active filters. It copies
the batch's logits once and works in place, or, when the penalties are the only filters that write, applies them
to the caller's logits and puts the replaced values back after the pick. When top_p or top_k is the last filter,
the chain draws from the tokens it keeps (nucleus.py, topk.py) instead of writing -inf over the rest of the row.
"""

import functools
import math
from dataclasses import replace

import numpy as np

from ..generation_config import GenerationConfig
from . import constraint, draw, nucleus, topk
from .draw import BLOCK, FEW_ALIVE, Prepared, Scratch, draw_rows, pick, search
from .filters import (
    COUNT,
    F32_MAX,
    GENERATED_COUNTS,
    NEVER_BAN,
    PENALTIES,
    READ_ONLY_LAST,
    SEEN,
    SEEN_IDS,
    _generated_offset,
    _penalty_factor,
    _repeated,
    bad_words,
    frequency_presence_penalty,
    logit_bias,
    min_new_tokens,
    min_p,
    no_repeat_ngram,
    repetition_penalty,
    temperature,
    top_k,
    top_p,
    typical_p,
)
from .tally import SeenTally, Tallies


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

    def constrain(self, logits, allowed) -> np.ndarray:
        """The first filter: -inf over the tokens each row's constraint forbids (a constraint.Allowed, or a bitmask
        [B, words] int32 with every bit set for a row without one), in place where the logits are writeable. Call it
        before the chain, and pass the chain no graph sampling outputs for these rows (prepared=None): the graph
        computed those weights from the unmasked logits, so they would draw forbidden tokens."""
        # [B, V] -> [B, V]
        if not logits.flags.writeable or logits.dtype != np.float32:
            logits = np.array(logits, dtype=np.float32)
        if not isinstance(allowed, constraint.Allowed):
            allowed = constraint.Allowed.from_bitmask(allowed, logits.shape[-1])
        return allowed.apply(logits)

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
