"""What happens to a call's rows after each forward pass, the same for a fixed batch (batch.py) and the running batch
(scheduler.py): the one place a row's next token is chosen and recorded.

    logits [k, V] of k running rows -> constrain (each constrained row's allowed tokens: its grammar's mask)
    -> pick (the call's SamplerChain, each row's own generator) -> append (ids, constraint, stop ids, length:
    RowState.append) -> log-probs -> text (Rows.take: stop strings, the row's Completion)

A failure of one row (its constraint's mask or matcher, the sampler on its row, its detokenizer) ends that row alone
with its own error (finish reason "error", Completion.error): the other rows go on as if it had never been there,
their generators untouched by it. decode_steps (runtime/engine/decode.py) takes a BatchPick as its pick: the engine
learns only each row's next id, or -1 once the row has finished.
"""

from typing import Iterator

import numpy as np

from ..engine.decode import decode_steps
from ..generation_config import GenerationConfig
from ..sampling import SamplerChain, log_softmax
from ..sampling.constraint import Masks
from .rows import Piece, Rows


class RowState:
    """One row's ids so far, generated count, finish reason, stop ids and constraint (or None).

    append(token) is the only way a row grows: it records the id, advances the constraint, and decides "stop" (an
    id that ends the row, or a constraint that is finished) and "length" (max_new_tokens generated)."""

    __slots__ = ("seen", "generated", "finish_reason", "stop_ids", "max_new_tokens", "constraint", "error")

    def __init__(self, prompt, stop_ids: tuple, max_new_tokens: int, constraint=None):
        self.seen = list(prompt)  # prompt and generated ids, for the repetition filters (the list only grows)
        self.generated: list = []
        self.finish_reason: str | None = None  # "stop", "length" or "error" once finished
        self.stop_ids = stop_ids  # ids that end the row (Rows.stop_ids: a constrained row's are its grammar's)
        self.max_new_tokens = max_new_tokens
        self.constraint = constraint  # a sampling.constraint.RowConstraint, or None
        self.error: Exception | None = None  # what ended the row, with finish reason "error"

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def append(self, token: int) -> str | None:
        """Record the row's next id; return the finish reason it brings ("stop", "length") or None."""
        self.seen.append(token)
        self.generated.append(token)
        if self.constraint is not None:
            self.constraint.advance(token)
        if token in self.stop_ids or (self.constraint is not None and self.constraint.finished):
            self.finish_reason = "stop"
        elif len(self.generated) == self.max_new_tokens:
            self.finish_reason = "length"
        return self.finish_reason


class Step:
    """The rows of one call (a Rows) as they are stepped: each row's state, the call's sampler, one generator per row.
    Calling it steps some of the rows; `error` is the first error that ended one."""

    def __init__(self, rows: Rows, vocab_size: int, rngs: list | None = None, second_thread: bool = True):
        config, self.rows, self.vocab_size = rows.config, rows, vocab_size
        self.sampler = SamplerChain(config, vocab_size, second_thread)  # second_thread: the sampler's, see there
        self.rngs = rows.generators() if rngs is None else rngs  # seeded from (seed, sequence index): Rows says
        self.states = [
            RowState(rows[i], rows.stop_ids[i], config.max_new_tokens, rows.constraint(i)) for i in range(len(rows))
        ]
        self.constrained = any(state.constraint is not None for state in self.states)
        self.error: Exception | None = None
        self.logits = None  # what the last call's tokens were picked from

    @property
    def running(self) -> int:
        """Rows not finished yet (those not started included)."""
        return sum(not state.finished for state in self.states)

    def __call__(self, indices: list, logits: np.ndarray, allowed=None, choose=None) -> list:
        """Rows `indices`' next ids from their logits [k, V] (not modified); the text pieces that became final.
        allowed: their allowed tokens (a constraint.Allowed of k rows) when the caller computed them while the graph
        ran, else computed here for a constrained call. `logits` is then what the tokens were picked from.
        choose(sampler, logits [1, V] constrained, seen, generated) -> id replaces the chain's pick for one row: the
        rule that verifies a token drawn from a draft model (runtime/speculative/verify.py)."""
        states = [self.states[i] for i in indices]
        if self.constrained:  # the first filter, on a copy: a prefill's logits serve each of a prompt's rows
            if allowed is None:
                masks = Masks(len(states), self.vocab_size)
                masks.start([state.constraint for state in states])
                allowed = masks.wait()
            for k, error in allowed.failed.items():
                self._fail(indices[k], error)
            logits = self.sampler.constrain(np.array(logits, dtype=np.float32), allowed)
        self.logits = logits
        live = [k for k, state in enumerate(states) if state.finish_reason is None]
        logprobs = log_softmax(logits) if self.rows.config.logprobs is not None else None
        pieces = []
        picked = self._pick(indices, logits, live) if choose is None else self._choose(indices, logits, live, choose)
        for k, token in picked:
            index, state = indices[k], states[k]
            try:
                reason = state.append(token)
                text, reason = self.rows.take(index, token, None if logprobs is None else logprobs[k], reason)
            except Exception as error:  # its matcher or its detokenizer: this row's alone
                self._fail(index, error)
                continue
            state.finish_reason = reason  # a stop string finishes it too
            if text:
                pieces.append(Piece(index, text))
        return pieces

    def _pick(self, indices: list, logits: np.ndarray, live: list) -> list:
        """[(k, token)] for the rows `live` (positions in indices and logits): one sampler call for all of them; if it
        fails, one call per row from the generators as they were, so that only the rows that fail alone fail."""
        if not live:
            return []
        rows = logits if len(live) == len(logits) else logits[live]
        seen = [self.states[indices[k]].seen for k in live]
        generated = [self.states[indices[k]].generated for k in live]
        rngs = [self.rngs[indices[k]] for k in live]
        sampled = self.sampler.do_sample and len(live) > 1
        kept = [rng.bit_generator.state for rng in rngs] if sampled else None
        try:
            return list(zip(live, self.sampler(rows, seen, generated, rngs).tolist()))
        except Exception as error:
            if len(live) == 1:
                self._fail(indices[live[0]], error)
                return []
        picks = []
        for j, k in enumerate(live):
            if kept is not None:
                rngs[j].bit_generator.state = kept[j]
            try:
                token = self.sampler(rows[j : j + 1], seen[j : j + 1], generated[j : j + 1], rngs[j : j + 1])[0]
                picks.append((k, int(token)))
            except Exception as error:
                self._fail(indices[k], error)
        return picks

    def _choose(self, indices: list, logits: np.ndarray, live: list, choose) -> list:
        """[(k, token)] chosen by `choose` for one live row."""
        if not live:
            return []
        (k,) = live
        state = self.states[indices[k]]
        try:
            return [(k, int(choose(self.sampler, logits[k : k + 1], state.seen, state.generated)))]
        except Exception as error:
            self._fail(indices[k], error)
            return []

    def _fail(self, index: int, error: Exception) -> None:
        """End row `index` with `error`: its Completion says so, and no other row sees it."""
        state = self.states[index]
        state.finish_reason, state.error = "error", error
        self.rows.fail(index, error)
        if self.error is None:
            self.error = error


class BatchPick:
    """decode_steps' pick for a fixed batch: every unfinished row of `step`, each constrained row's allowed tokens
    computed in a thread of their own while the graph runs the pass before (constraint.Masks). After each call,
    `pieces` holds the text that became final and `logits` what the tokens were picked from."""

    def __init__(self, step: Step):
        self.step, rows = step, len(step.states)
        self.masks = Masks(rows, step.vocab_size) if step.constrained else None
        self.pieces, self.logits = [], None
        if self.masks:
            self.masks.start(self._constraints())  # the first masks while the prompt runs

    def _constraints(self) -> list:
        return [None if state.finished else state.constraint for state in self.step.states]

    def __call__(self, logits: np.ndarray) -> tuple[np.ndarray, int]:
        # [B, V] -> [B] int64 tokens, -1 for a row finished before this step; rows still running after it
        states = self.step.states
        running = [r for r, state in enumerate(states) if state.finish_reason is None]
        allowed = self.masks.wait().take(running) if self.masks else None
        self.pieces = self.step(running, logits if len(running) == len(states) else logits[running], allowed)
        self.logits = self.step.logits
        tokens = np.full(len(states), -1, dtype=np.int64)
        tokens[running] = [-1 if states[r].error is not None else states[r].generated[-1] for r in running]
        if self.masks:  # the next masks while the caller reads this step and the graph runs the next
            self.masks.start(self._constraints())
        return tokens, sum(states[r].finish_reason is None for r in running)


def id_steps(
    engine, prompts: list, config: GenerationConfig, pad_id: int, rngs: list | None = None, grammars=()
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """A fixed batch on token ids alone, no text (benchmarks, checks): per step, (tokens [B] int64, -1 for a row
    finished before it; the logits they were picked from, [B, V] while every row runs, else the running rows').
    rngs: one generator per row (default: seeded from config.seed, as a Batch's rows are); grammars: per prompt a
    compiled constraint (sampling.constraint.Grammar) or None."""
    step = Step(Rows(None, prompts, config, grammars=grammars), engine.vocab_size, rngs, not engine.workers_spin)
    pick = BatchPick(step)
    for tokens in decode_steps(engine, step.rows.ids, pick, pad_id, config.max_new_tokens):
        yield tokens, pick.logits
