"""A batch: one call's rows decoded together on the engine, one layer above it: prompts in, text pieces and
finished completions out.

A Batch (all its rows) yields Pieces (a row's new text) and ends with one Completion per row; a Stream is the
single-row view that yields plain strings. The rows' output (text streams, their Completions) is a Rows
(runtime/batching/rows.py), stepped after each forward pass by a Step (step.py), as the continuous-batching
scheduler steps the rows of each job it runs; the engine's decode loop asks the Step for each row's next id and
stops feeding a row once it says the row has finished (end-of-text, length, a stop string, or its own error).
A row that fails ends alone: its Completion holds the error (finish_reason "error"), the other rows go on.
"""

from dataclasses import dataclass, field

from .. import speculative
from ..engine.decode import decode_steps
from ..generation_config import GenerationConfig
from .rows import Completion, Piece, Rows
from .step import BatchPick, Step

__all__ = ["MAX_BATCH_TOKENS", "Batch", "Completion", "Piece", "Rows", "Stream"]

# Rows x positions (prompt + max_new_tokens) one call may decode: the key/value cache and the logits grow with
# it (at distilgpt2's size about 37 KB of fp32 cache per position). Twice the largest request `edgelm serve`
# accepts by default (16 prompts x n 8 x 1,024 tokens).
MAX_BATCH_TOKENS = 1 << 18


@dataclass
class Batch:
    """Iterate to run it: yields Piece objects as text becomes final; `completions` is filled at the end.
    Breaking out of the iteration (or calling close()) stops the work at once."""

    engine: object
    tokenizer: object
    prompts: list  # token ids per prompt, already checked and truncated
    config: GenerationConfig
    pad_id: int
    truncated: list = field(default_factory=list)  # dropped prompt tokens per prompt
    # per prompt: its compiled constraint (runtime/sampling/constraint.py Grammar) or None; empty: none at all
    grammars: list = field(default_factory=list)
    draft: object = None  # the draft Model for speculative="draft" (runtime/speculative/draft.py), or None

    def __post_init__(self):
        self.rows = Rows(self.tokenizer, self.prompts, self.config, self.truncated, self.grammars)
        self._steps = None
        self.speculation = None  # a speculative.Speculation: what several tokens per pass did (one row only)

    def __iter__(self):
        step = Step(self.rows, self.engine.vocab_size, second_thread=not self.engine.workers_spin)
        state = step.states[0]
        if speculative.uses(self.config, len(step.states), [state.constraint], self.draft):  # several tokens a pass
            self.speculation = speculative.Speculation()
            proposer = speculative.proposer(self.config, self.draft, len(state.seen), step.rngs[0])
            self._steps = speculative.speculative_steps(self.engine, step, self.pad_id, proposer, self.speculation)
            pieces = self._steps
        else:
            pick = BatchPick(step)
            self._steps = decode_steps(self.engine, self.rows.ids, pick, self.pad_id, self.config.max_new_tokens)
            pieces = (pick.pieces for _ in self._steps)
        try:
            for step_pieces in pieces:
                yield from step_pieces
        finally:
            self.close()
        if self.speculation is not None and self.completions:
            self.completions[0].speculation = self.speculation.to_dict()

    @property
    def completions(self) -> list:
        """One Completion per row once every row has finished (empty before, or when stopped early)."""
        return self.rows.completions

    @property
    def error(self) -> Exception | None:
        """The first row's error among the completions (a row that failed alone), or None."""
        return next((c.error for c in self.completions if c.error is not None), None)

    def close(self) -> None:
        if self._steps is not None:
            self._steps.close()

    def run(self) -> list:
        """Run to the end and return the completions."""
        for _ in self:
            pass
        return self.completions


class Stream:
    """One completion's text pieces (str) as they become final; `completion` is set once it is done.
    Breaking out of the loop (or calling close()) stops generation."""

    def __init__(self, batch: Batch):
        self.batch = batch
        self.completion: Completion | None = None

    def __iter__(self):
        try:
            for piece in self.batch:
                yield piece.text
        finally:
            self.batch.close()
        if self.batch.completions:
            self.completion = self.batch.completions[0]
            if self.completion.error is not None:  # its one row failed: the stream ends with the row's error
                raise self.completion.error

    def close(self) -> None:
        self.batch.close()
