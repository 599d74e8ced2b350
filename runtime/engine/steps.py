"""One row's decode bookkeeping and a prefill's inputs: the facts the decode loop (decode.py) and the running batch
(runtime/batching/scheduler.py) both keep, written once.

A RowState is one row of a request: the ids it has seen (prompt, then generated), the ids it generated, why it
finished (None while it runs), the ids that end it and, for constrained decoding, its constraint
(runtime/sampling/constraint.py: an object that works on ids). append(token) is the only way a row grows:
it records the id, advances the constraint, and decides "stop" (an id that ends the row, or a constraint that
is finished) and "length" (max_new_tokens generated).
"""

import numpy as np


class RowState:
    """One row's ids so far, generated count, finish reason, stop ids and constraint (or None)."""

    __slots__ = ("seen", "generated", "finish_reason", "stop_ids", "max_new_tokens", "constraint")

    def __init__(self, prompt, stop_ids, max_new_tokens: int, constraint=None):
        self.seen = list(prompt)  # prompt and generated ids, for the repetition filters (the list only grows)
        self.generated: list = []
        self.finish_reason: str | None = None  # "stop" or "length" once finished
        self.stop_ids = stop_ids  # ids that end the row: end-of-text (a constrained row: its grammar's)
        self.max_new_tokens = max_new_tokens
        self.constraint = constraint  # a sampling.constraint.RowConstraint, or None

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


def row_stop_ids(stop_ids: tuple, constraint) -> tuple:
    """A row's end ids: the settings' (GenerationConfig.stop_ids: none with ignore_eos); for a constrained row, its
    grammar's end-of-text ids alone (`constraint`: a Grammar or RowConstraint, or None). The mask allows those only
    where the grammar may end, and a finished grammar ends the row whatever ignore_eos says; any other id the
    settings name is, to the grammar, one more token of the output, so it cannot cut the output short."""
    if constraint is None:
        return stop_ids
    return tuple(constraint.eos_ids)


def prefill_inputs(prompts: list, pad_id: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Prompts of any lengths -> (input_ids, attention_mask, position_ids), each [B, T] int64: left-padded with
    pad_id (masked, so any id serves), positions counting each row's real tokens (one unpadded prompt: 0..T-1)."""
    width = max(len(p) for p in prompts)
    input_ids = np.full((len(prompts), width), pad_id, dtype=np.int64)
    attention_mask = np.zeros((len(prompts), width), dtype=np.int64)
    for row, prompt in enumerate(prompts):
        if len(prompt):
            input_ids[row, -len(prompt) :] = prompt
            attention_mask[row, -len(prompt) :] = 1
    return input_ids, attention_mask, position_ids_from_mask(attention_mask)


def position_ids_from_mask(attention_mask: np.ndarray) -> np.ndarray:
    """transformers' rule: count real tokens, padding gets position 1 (it is masked out anyway)."""
    positions = np.cumsum(attention_mask, axis=1) - 1
    return np.where(attention_mask == 0, 1, positions).astype(np.int64)
