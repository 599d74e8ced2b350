"""A batch: one call's rows decoded together on the engine, one layer above it: prompts in, text pieces and
finished completions out.

A Batch (all its rows) yields Pieces (a row's new text) and ends with one Completion per row; a Stream is the
single-row view that yields plain strings. The rows' own state (text streams, generators, constraints, their
output) is a Rows (runtime/batching/rows.py); a Batch drives it with the engine's decode loop, as the
continuous-batching scheduler drives the Rows of each job it runs. A row whose text reaches a stop string is
marked finished for the engine, which stops decoding it.
"""

from dataclasses import dataclass, field

from .. import speculative
from ..engine.decode import decode_steps
from ..generation_config import GenerationConfig
from ..sampling import log_softmax
from .rows import Completion, Piece, Rows

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
        # finished: row -> finish reason, shared with the engine: it adds end-of-text and length, we add stops
        rows, finished = self.rows, {}
        constraints = [rows.constraint(row) for row in range(len(rows))]
        if speculative.uses(self.config, len(rows), constraints, self.draft):  # one row: several tokens per pass
            self.speculation = speculative.Speculation()
            rng = rows.generators()[0]
            proposer = speculative.proposer(self.config, self.draft, len(rows.ids[0]), rng)
            self._steps = speculative.speculative_steps(
                self.engine, rows.ids[0], self.config, rng, self.pad_id, finished, constraints[0], proposer,
                self.speculation,
            )  # fmt: skip
        else:
            self._steps = decode_steps(
                self.engine, rows.ids, self.config, rows.generators(), self.pad_id, finished, constraints
            )
        try:
            for tokens, logits in self._steps:
                logprobs = log_softmax(logits) if self.config.logprobs is not None else None
                for row, token in enumerate(tokens.tolist()):
                    if token < 0:  # finished before this step
                        continue
                    text, reason = rows.take(row, token, None if logprobs is None else logprobs[row], finished.get(row))
                    if reason is not None:
                        finished[row] = reason  # a stop string: the engine decodes this row no further
                    if text:
                        yield Piece(row, text)
        finally:
            self.close()
        if self.speculation is not None and self.completions:
            self.completions[0].speculation = self.speculation.to_dict()

    @property
    def completions(self) -> list:
        """One Completion per row once every row has finished (empty before, or when stopped early)."""
        return self.rows.completions

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

    def close(self) -> None:
        self.batch.close()
