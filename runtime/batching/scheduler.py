"""Continuous batching: one thread owns the model's session and one running batch; requests join and leave it
between steps, each with its own options, random generators, stop strings and length.

    submit(job) -> arrival order -> (step boundary) job.start(); each row of job.batch prefilled alone
    (batch 1, the engine's usual path, where the prefix cache serves; one-prompt jobs with a short prompt that
    arrive together share one left-padded pass), its first token picked, its cache copied into a free slot
    (slot_cache.py); jobs that arrive meanwhile join too, up to JOIN_ROUNDS rounds -> one forward pass for
    every row in the batch -> each job's Step (step.py: constrain, pick, append, text, as in a fixed batch)
    steps its own rows -> text pieces (job.piece) -> a finished row frees its slot at once -> a job whose rows
    have all finished ends (job.finish); a job one of whose rows failed ends at once with that row's error

Several tokens per pass (runtime/speculative/): while the batch holds at most `speculative_rows` rows (default
SPECULATIVE_ROWS) and one of them has something to propose (its request's `speculative` option: prompt lookup, a
draft model, its constraint's forced tokens), each row takes a verify pass of its own over its slot (propose,
verify, accept: speculative_round) instead of the shared one-token step: one row alone gains what a call of one
row gains. With more rows, one pass for all of them already reads the weights once for several tokens, and a
pass per row would read them once per row: every row decodes one token per pass. A greedy row's output is the
same either way (the picks are the sampler chain's own).

A job is any object with: `batch` (a runtime Batch, whose `rows` (runtime/batching/rows.py) this thread drives;
None once start() has done all the work, as a scoring request does), start() (called first, in this thread), check() (raises to stop the job: called at every step
boundary while it waits or runs), piece(Piece), and finish(error) (None: batch.completions is ready; else why
it ended). A job's failure (its row's constraint, text, pieces) is its own: the other jobs' rows go on as if it
had never been there. Rows join in arrival order as slots free up, so no request waits behind a later one. Whatever
shares its batch, a greedy or seeded row of an fp32 graph gets the tokens it gets alone (its logits equal to
rounding); int8 graphs quantize activations per pass, over all rows at once, so theirs may differ a little
(benchmarks/batch_drift.py measures both).
"""

import threading
from collections import deque
from functools import partial

import numpy as np

from .. import speculative
from ..engine.decode import PREFILL_CHUNK as CHUNK
from ..engine.steps import prefill_inputs
from ..sampling.constraint import Masks
from .slot_cache import SlotCache
from .step import Step

# Rounds of joins one step boundary may run. Requests that arrive while rows are prefilled (clients sending as
# their previous answers end, all at once) join in the next round, before the next decode step: their first
# token waits for one more prefill, not for a step of the rows just joined as well. The running rows' next
# token waits for at most this many rounds of prefills.
JOIN_ROUNDS = 2
# Rows at most in the running batch for its rows to speculate (a verify pass each). Above it, the batched step
# reads the weights once for every row's token, which a pass per row cannot beat (benchmarks/speculative.py).
SPECULATIVE_ROWS = 1
# Draft ids per row and pass at most in the running batch: the slot cache reserves the columns before the passes.
SPECULATIVE_TOKENS = 16


class Entry:
    """A submitted job and its progress: its rows' Step (their states, its sampler, one generator per row), and the
    rows not yet in the batch."""

    def __init__(self, job, vocab_size: int):
        self.job, self.rows = job, job.batch.rows
        self.step = Step(self.rows, vocab_size, second_thread=not job.batch.engine.workers_spin)
        self.waiting = deque(range(len(self.rows)))  # rows not yet prefilled, in order
        self.prefilled = None  # (prompt index, its batch-1 decoder, logits [V]): shared by that prompt's n rows
        self.rounds: dict = {}  # row index -> (its proposer, a speculative.Speculation), or None: it never proposes

    def speculation(self, index: int, draft) -> tuple | None:
        """Row `index`'s proposer and statistics if its settings speculate (draft: the model's draft Model or None)."""
        if index not in self.rounds:
            config, state = self.rows.config, self.step.states[index]
            self.rounds[index] = None
            if speculative.uses(config, 1, [state.constraint], draft):
                proposer = speculative.proposer(config, draft, len(self.rows[index]), self.step.rngs[index])
                self.rounds[index] = (proposer, speculative.Speculation())
        return self.rounds[index]

    def record(self) -> None:
        """Each row that speculated: its statistics in its Completion (Completion.speculation)."""
        completions = self.rows.completions
        for index, round_ in self.rounds.items():
            if round_ is not None and round_[1].passes and completions:
                completions[index].speculation = round_[1].to_dict()


class Row:
    """One row of a job in the running batch, as its slot holds it."""

    __slots__ = ("entry", "index")

    def __init__(self, entry: Entry, index: int):
        self.entry, self.index = entry, index

    @property
    def state(self):
        return self.entry.step.states[self.index]

    @property
    def finished(self) -> bool:
        return self.state.finished

    @property
    def next_token(self) -> int:
        """The id fed at the next step: the row's last."""
        return self.state.generated[-1]


class Scheduler:
    """Runs submitted jobs in one running batch of up to `max_rows` rows on `model`, in a thread of its own."""

    def __init__(self, model, max_rows: int, speculative_rows: int = SPECULATIVE_ROWS):
        self.engine, self.vocab_size = model.engine, model.arch.vocab_size
        self.draft = getattr(model, "draft", None)  # the draft Model of load(..., draft=), or None
        self.speculative_rows = speculative_rows
        self.cache = SlotCache(model.engine, max_rows, model.arch.n_positions)
        self.masks = Masks(max_rows, self.vocab_size)  # the running batch's constrained rows' masks, by slot
        self.entries: list = []  # running or waiting jobs, in arrival order (this thread only)
        self._new: deque = deque()
        self._wake = threading.Condition()
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="edgelm-batch", daemon=True)  # started by submit

    def submit(self, job) -> None:
        """Queue `job`; it starts at the next step boundary (from any thread)."""
        with self._wake:
            if self._closing:
                raise RuntimeError("the scheduler is closed: make a new one")
            self._new.append(job)
            self._wake.notify()
            if not self._thread.is_alive():
                self._thread.start()

    def close(self) -> None:
        """Take no more jobs, let the submitted ones run to their end (stop them first to end sooner), and wait."""
        with self._wake:
            self._closing = True
            self._wake.notify()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        while self._wait():
            try:
                self._boundary()  # its locals go when it returns: an idle thread holds no job's objects
            except BaseException as error:  # a fault of the scheduler itself: every job ends with it, none hangs
                entries, self.entries = self.entries, []
                self.cache = SlotCache(self.engine, self.cache.max_rows, self.cache.max_width)
                for entry in entries:
                    _finish(entry.job, error)

    def _wait(self) -> bool:
        """Until there is work (True) or the scheduler is closed and has none left (False)."""
        with self._wake:
            while not (self._new or self.entries or self._closing):
                self._wake.wait()
            return bool(self._new or self.entries)

    def _boundary(self) -> None:
        """Between two steps: stop the jobs that must stop, start new ones, fill free slots, then step. Jobs that
        arrive while those rows are prefilled join before the step too, in up to JOIN_ROUNDS rounds in all."""
        for entry in list(self.entries):
            self._guard(entry, entry.job.check)
        for _ in range(JOIN_ROUNDS):
            with self._wake:
                new, self._new = self._new, deque()
            for job in new:
                self._start(job)
            self._join()
            # nothing arrived that could join now: the batch steps (read without the lock: a job that arrives
            # just after this waits for the next boundary)
            if not (self._new and self.cache.free):
                break
        if self.cache.rows:
            self._step()

    def _step(self) -> None:
        """Decode, several tokens per row (a few rows that propose) or one for every row, then free the finished
        rows' slots and end the jobs whose rows have all finished."""
        rows = list(self.cache.rows)
        if len(rows) <= self.speculative_rows and any(r.entry.speculation(r.index, self.draft) for r in rows):
            self._speculate(rows)
        else:
            self._decode(rows)
        for slot in reversed(range(len(self.cache.rows))):  # a finished row's slot is free at once
            if self.cache.rows[slot].finished:
                self.cache.leave(slot)
        for entry in dict.fromkeys(row.entry for row in rows):
            if not entry.step.running and entry in self.entries:
                self._end(entry, None)

    def _speculate(self, rows: list) -> None:
        """Each row alone: propose, verify in one pass over its slot, accept (speculative_round); a row that does
        not propose takes a pass of one token. Then the slot cache keeps what each row accepted."""
        self.cache.reserve_columns(SPECULATIVE_TOKENS + 1)
        kept, failed = [], {}
        for slot, row in enumerate(rows):
            entry, before = row.entry, len(row.state.seen)
            if entry not in failed and not row.finished:
                round_ = entry.speculation(row.index, self.draft)  # None: a pass of its one next token
                proposer, stats = round_ or (None, speculative.Speculation())
                limit = SPECULATIVE_TOKENS if round_ else 0
                verify = partial(self.cache.verify, slot)  # tokens -> logits [len(tokens), V]
                try:
                    pieces = speculative.speculative_round(entry.step, row.index, proposer, stats, verify, limit)
                    for piece in pieces:
                        entry.job.piece(piece)
                    if entry.step.error is not None:
                        raise entry.step.error
                except BaseException as error:  # the job's alone; it ends once the slots are settled
                    failed[entry] = error
            kept.append(len(row.state.seen) - before)  # the last token and the accepted draft: now in the cache
        self.cache.settle(kept)
        for entry, error in failed.items():
            self._end(entry, error)

    def _decode(self, rows: list) -> None:
        """One token for every row in the batch, then each job picks its rows' next ids."""
        constraints = [row.state.constraint for row in rows]
        constrained = any(c is not None for c in constraints)
        if constrained:  # the constrained rows' masks, computed while the step runs (a row's failure is its own)
            self.masks.start(constraints)
        try:
            logits = self.cache.step(np.array([row.next_token for row in rows], dtype=np.int64))  # [n, V]
            allowed = self.masks.wait() if constrained else None
        except BaseException as error:  # the pass itself failed: every job in it ends with that error
            for entry in dict.fromkeys(row.entry for row in rows):
                self._end(entry, error)
            return
        slots: dict = {}  # entry -> its rows' slots, in slot order
        for slot, row in enumerate(rows):
            slots.setdefault(row.entry, []).append(slot)
        for entry, mine in slots.items():
            mine_allowed = allowed.take(mine) if allowed is not None and entry.step.constrained else None
            self._guard(entry, self._pick, entry, [rows[s].index for s in mine], logits[mine], mine_allowed)

    def _pick(self, entry: Entry, indices: list, logits: np.ndarray, allowed=None) -> None:
        """Step the job's rows `indices` from their logits [k, V] (allowed: their allowed tokens, a constraint.Allowed,
        where the batch computed them) and hand the job its pieces; raise the error of a row that failed (the
        job's answer is that error: the job ends)."""
        for piece in entry.step(indices, logits, allowed):
            entry.job.piece(piece)
        if entry.step.error is not None:
            raise entry.step.error

    def _start(self, job) -> None:
        try:
            job.start()
            if job.batch is None:  # start() did all of it
                job.finish(None)
                return
            entry = Entry(job, self.vocab_size)
            job.check()  # stopped while it waited in the queue
        except BaseException as error:
            _finish(job, error)
            return
        self.entries.append(entry)

    def _join(self) -> None:
        """Prefill waiting rows into free slots, strictly in arrival order."""
        together = self._short_arrivals()
        if len(together) > 1:
            self._prefill_together(together)
        for entry in list(self.entries):
            while entry.waiting and self.cache.free:
                if not self._guard(entry, self._prefill, entry, entry.waiting.popleft()):
                    break
            if not entry.step.running and entry in self.entries:  # every row finished at its first token
                self._end(entry, None)
            if not self.cache.free:
                return

    def _prefill(self, entry: Entry, index: int) -> None:
        """Row `index` of the job: its prompt through a batch-1 decoder (once for a prompt's n rows), its first
        token picked from the last position's logits, then (unless that finished it) into a slot."""
        rows = entry.rows
        prompt = index // rows.config.num_return_sequences
        if entry.prefilled is None or entry.prefilled[0] != prompt:
            entry.prefilled = None  # the previous prompt's decoder goes first
            ids, attention_mask, position_ids = prefill_inputs([rows[index]], 0)
            decoder = self.engine.decoder(1, ids.shape[1])
            logits = decoder.run(ids, attention_mask, position_ids)[:, -1, :].copy()
            entry.prefilled = (prompt, decoder, logits)
        _, decoder, logits = entry.prefilled
        row = Row(entry, index)
        self._pick(entry, [index], logits)
        if not row.finished:
            self.cache.join(row, decoder.buffers, len(rows[index]))
        if not entry.waiting or entry.waiting[0] // rows.config.num_return_sequences != prompt:
            entry.prefilled = None

    def _short_arrivals(self) -> list:
        """The jobs at the head of the queue that wait with one short prompt each (under one prefill chunk: nothing
        the prefix cache could reuse or keep), as many as there are free slots: requests that arrive together
        are prefilled in one pass, so the last of them does not wait for the others' prefills one by one."""
        together = []
        for entry in self.entries:
            if not entry.waiting:
                continue
            if len(together) == self.cache.free or len(entry.rows) != 1 or len(entry.rows[0]) >= CHUNK:
                break
            together.append(entry)
        return together

    def _prefill_together(self, entries: list) -> None:
        """One left-padded prefill pass for `entries`' single rows; each picks its first token, then (all their
        first pieces sent) those it did not finish join slots, the cache grown for all of them at once."""
        prompts = [entry.rows[0] for entry in entries]
        input_ids, attention_mask, position_ids = prefill_inputs(prompts, 0)  # padding is masked: any id serves
        width = input_ids.shape[1]
        try:
            decoder = self.engine.decoder(len(prompts), width)
            logits = decoder.run(input_ids, attention_mask, position_ids)[:, -1, :]
        except BaseException as error:  # the pass failed: each of its jobs ends with that error
            for entry in entries:
                self._end(entry, error)
            return
        joining = []  # (k, row): the rows that go on
        for k, entry in enumerate(entries):
            row = Row(entry, entry.waiting.popleft())
            if self._guard(entry, self._pick, entry, [row.index], logits[k : k + 1]) and not row.finished:
                joining.append((k, row))
            if not entry.step.running and entry in self.entries:
                self._end(entry, None)
        self.cache.reserve(len(self.cache.rows) + len(joining), width)
        for k, row in joining:
            start = width - len(prompts[k])
            self.cache.join(row, decoder.buffers, len(prompts[k]), source_row=k, source_start=start)

    def _guard(self, entry: Entry, function, *args) -> bool:
        """Run function(*args) for `entry`; if it raises, end that job with the error. Whether it went well."""
        try:
            function(*args)
            return True
        except BaseException as error:
            self._end(entry, error)
            return False

    def _end(self, entry: Entry, error: BaseException | None) -> None:
        """Take the job's rows out of the batch and hand it its end: completions, or the error."""
        for slot in reversed(range(len(self.cache.rows))):
            if self.cache.rows[slot].entry is entry:
                self.cache.leave(slot)
        if entry in self.entries:
            self.entries.remove(entry)
        entry.prefilled = None
        if error is None:
            entry.record()
        _finish(entry.job, error)


def _finish(job, error: BaseException | None) -> None:
    try:
        job.finish(error)
    finally:
        if error is not None:  # its traceback holds this thread's frames, and they the batch: let them go now
            error.__traceback__ = None
