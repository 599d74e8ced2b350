"""The sampler chain: a request's active filters (filters.py) in their fixed order, then one picker (draw.py).

A SamplerChain is built once per request from its GenerationConfig and holds only the active filters. Calling it
filters the batch's logits, then picks one token per row. The filters work on one copy of the logits, or, when the
penalties are the only filters that write, on the caller's logits, whose replaced values are put back after the
pick. A last top_k or top_p only reads the row: the picker draws from the tokens it keeps (topk.py, nucleus.py)
instead of writing -inf over the rest.
"""

import functools
from array import array
from dataclasses import replace

import numpy as np

from ..generation_config import GenerationConfig
from . import constraint, nucleus, topk
from .draw import FEW_ALIVE, Scratch, pick
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

_F32_MAX = float(F32_MAX)  # repetition_penalty's clip, as a Python float
# Up to this many seen ids, the penalties' arithmetic runs on Python floats: right after a model step, the eight
# NumPy calls and the error state of whole-array arithmetic cost about as much as 250 ids' worth of Python
# (benchmarks/results/2026-12-07-sampler-cost.md); past it, the Python grows with the ids and NumPy does not.
FEW_IDS = 256


class SamplerChain:
    """One request's next-token choice: its active filters in the order of the module docstring, then the pick.

    Built once per request. Calling it takes the rows' raw logits [B, V], their seen ids (prompt and
    generated) and generated ids, and one random generator per row; it returns one token id per row.
    second_thread: whether a batch's draw may use a second core (draw.Scratch); False where onnxruntime's workers
    spin on it right after each forward pass.
    The penalties, when active, are applied together (the generated ids are among the seen ones): one read and one
    write of each row's seen ids, with the same arithmetic, in the same order, as the two filters one after the
    other. When they are the only filters that write (the pick, or a last top_k or top_p, only reads), the chain
    writes them into the caller's logits, picks, and writes the saved logits back, instead of copying the row.
    """

    def __init__(self, config: GenerationConfig, vocab_size: int, second_thread: bool = True):
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
        self.scratch = Scratch(second_thread)  # the arrays each step works in, kept for the next step
        self.seen_ids, self.generated_counts = Tallies(), Tallies()  # what the penalties read, kept up to date
        active = dict(self.filters)
        self.penalties = sum(f in PENALTIES for f in active)  # how many of the first filters are penalties
        self.factor = _penalty_factor(*active[repetition_penalty]) if repetition_penalty in active else None
        weigh = None
        if frequency_presence_penalty in active:  # each generated id's offset, kept up to date by its tally
            frequency, presence = active[frequency_presence_penalty]
            weigh = functools.partial(_generated_offset, frequency=frequency, presence=presence)
        self.seen_tallies = Tallies(functools.partial(SeenTally, weigh=weigh))
        # a last top_k or top_p only reads the row: the picker draws from what it keeps
        self.last = self.filters[-1] if self.filters and self.filters[-1][0] in READ_ONLY_LAST else None
        self.writers = self.filters[:-1] if self.last else self.filters  # the filters that write into the logits
        self.restores = bool(self.writers) and len(self.writers) == self.penalties  # penalties in place, then restored

    def constrain(self, logits, allowed) -> np.ndarray:
        """The first filter: -inf over the tokens each row's constraint forbids (a constraint.Allowed, or a bitmask
        [B, words] int32 with every bit set for a row without one), in place where the logits are writeable. Call it
        before the chain."""
        # [B, V] -> [B, V]
        if not logits.flags.writeable or logits.dtype != np.float32:
            logits = np.array(logits, dtype=np.float32)
        if not isinstance(allowed, constraint.Allowed):
            allowed = constraint.Allowed.from_bitmask(allowed, logits.shape[-1])
        return allowed.apply(logits)

    def __call__(self, logits, seen: list, generated: list, rngs: list) -> np.ndarray:
        """seen[r], generated[r]: row r's ids lists. The chain follows each list object as it grows between calls
        (the decode loop appends to it), so a list may only grow at its end; a new list object is counted anew.
        The logits are as they were when it returns."""
        # [B, V] -> [B] int64
        out, saved = self._filtered(logits, seen, generated)
        try:
            return self.pick(out, rngs)
        finally:
            if saved is not None:
                _put_back(logits, saved)

    def _filtered(self, logits, seen: list, generated: list) -> tuple[np.ndarray, list | None]:
        """(the logits after every filter that writes, what to put back into the caller's logits or None): the
        logits themselves when no filter writes; the caller's with the penalties written in, when those are the
        only writers (and the logits can take them); else one copy, filtered in place."""
        if not self.writers:
            return logits, None
        if self.restores and logits.flags.writeable:
            saved = self._penalize(logits, seen, generated)
            if saved is not None:
                return logits, saved
        out = self.scratch.get("logits", logits.shape, logits.dtype)
        np.copyto(out, logits)
        return self._apply(out, self.writers, seen, generated), None

    def pick(self, out, rngs: list) -> np.ndarray:
        """The picker: argmax, or one draw per row from softmax(out) with the row's own generator; after a last
        top_k or top_p, a draw among the tokens it keeps (out holds every other filter's work)."""
        # [B, V] -> [B] int64
        if self.last is None:
            return pick(out, self.do_sample, rngs, scratch=self.scratch, dense=self.dense)
        last, (option,) = self.last
        if last is top_k:  # draw from the tokens it keeps: no -inf written over the rest
            return topk.draw_kept(out, option, rngs)
        if option >= nucleus.REJECT_FROM:
            return nucleus.draw_from(out, option, rngs, self.scratch)
        given = nucleus.cut(out, option, ban=False, scratch=self.scratch)  # the pick reuses its exp(logits - max)
        return pick(out, self.do_sample, rngs, given, self.scratch)

    def process(self, logits, seen: list, generated: list) -> np.ndarray:
        """The filtered logits: a copy, or the input itself when no filter is active."""
        # [B, V] -> [B, V]
        if not self.filters:
            return logits
        return self._apply(logits.copy(), self.filters, seen, generated)

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
        never generated; None without the frequency and presence penalties), rounded to float32: the two filters'
        arithmetic, in order (repetition_penalty's factor, see _repeated, rounded to float32, then the float32
        subtraction of the offsets)."""
        if values.size > FEW_IDS:
            with np.errstate(over="ignore", invalid="ignore"):  # see _repeated
                if self.factor is None:
                    return values - offsets  # x - 0 is x, -0 and -inf included
                if offsets is None:
                    return _repeated(values, self.factor).astype(np.float32)
                return np.subtract(_repeated(values, self.factor), offsets, dtype=np.float32)
        # On Python floats (IEEE float64, as NumPy's), each result rounded to float32 by array("f") (a C cast: round
        # to nearest, past float32's range +-inf, as NumPy's cast, without its warnings); the clip keeps NaN, as
        # np.minimum does; the float64 difference of two float32 values rounds once to their float32 difference.
        penalized = values.tolist()
        if self.factor is not None:
            factor, top = float(self.factor), _F32_MAX
            penalized = array("f", [top if (y := x * factor if x < 0 else x / factor) > top else y for x in penalized])
        if offsets is not None:
            penalized = array("f", [x - offset for x, offset in zip(penalized, offsets.tolist())])  # x - 0 is x
        return np.frombuffer(penalized, dtype=np.float32)

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
