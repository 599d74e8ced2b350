"""A batch: the rows of one call, decoded together, one layer above the engine: prompts in, text pieces and finished completions out.

Three types describe a request's output: a Batch (all its rows) yields Pieces (a row's new text) and ends
with one Completion per row; a Stream is the single-row view that yields plain strings. Rows are
prompts x num_return_sequences, prompt-major. Each row has its own TextStream (UTF-8-safe, stop strings
cut) and its own random generator seeded from (seed, sequence index), so a row's tokens do not depend on
what else shares its batch. A row whose text reaches a stop string is marked finished for the engine,
which stops decoding it.
"""

import json
from dataclasses import dataclass, field

import numpy as np

from ..engine.decode import decode_steps
from ..engine.steps import row_stop_ids
from ..generation_config import GenerationConfig
from ..sampling import log_softmax, top_logprobs
from ..text.stream import TextStream
from ..text.tokenizer import decode

PREFIX_TOKENS = 4  # prompt ids a text stream sees as context for its first pieces
# Rows x positions (prompt + max_new_tokens) one call may decode: the key/value cache and the logits grow with
# it (at distilgpt2's size about 37 KB of fp32 cache per position). Twice the largest request `edgelm serve`
# accepts by default (16 prompts x n 8 x 1,024 tokens).
MAX_BATCH_TOKENS = 1 << 18


@dataclass
class Completion:
    """A finished row: text, token ids, why it stopped, token counts, and log-probs when asked for."""

    text: str
    token_ids: list  # the generated ids the text was decoded from (end-of-text itself is not included)
    finish_reason: str  # "stop": end-of-text or a stop string; "length": max_new_tokens reached
    prompt_tokens: int
    completion_tokens: int
    index: int = 0  # row index: prompt_index * num_return_sequences + sequence
    prompt_index: int = 0
    stop_string: str | None = None
    truncated_prompt_tokens: int = 0  # oldest prompt tokens dropped by truncate=True
    logprobs: list | None = None  # per token: {"token_id", "token", "logprob", "top_logprobs": [...]}
    # a constrained row's value: the JSON value (json_schema, json_object) or the chosen string (choices); None
    # when the row was cut before its constraint was complete ("length", or a stop string), or for regex and grammar
    # (the text is the value)
    parsed: object = None
    constraint: str | None = None  # the row's constraint: "json_schema", "json_object", "regex", "grammar", "choices"

    def to_dict(self) -> dict:
        """The fields as a dict; an unconstrained row's has neither parsed nor constraint."""
        fields = dict(self.__dict__)
        if self.constraint is None:
            del fields["parsed"], fields["constraint"]
        return fields


@dataclass
class Piece:
    """Text that became final for one row during a step."""

    index: int
    text: str


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
    completions: list = field(default_factory=list)
    # per prompt: its compiled constraint (runtime/sampling/constraint.py Grammar) or None; empty: none at all
    grammars: list = field(default_factory=list)

    def __post_init__(self):
        n = self.config.num_return_sequences
        self.rows = [p for p in self.prompts for _ in range(n)]
        self._grammars = [g for g in self.grammars for _ in range(n)] if self.grammars else [None] * len(self.rows)
        # the ids that end each row: a constrained row's grammar end as well as the settings'
        self.stop_ids = [row_stop_ids(self.config.stop_ids, g) for g in self._grammars]
        self._streams = [TextStream(self.tokenizer, self.config.stop, self._context(r)) for r in self.rows]
        self._tokens = [[] for _ in self.rows]
        self._logprobs = [[] if self.config.logprobs is not None else None for _ in self.rows]
        self._results = [None] * len(self.rows)
        self._steps = None

    def __iter__(self):
        finished = {}  # row -> finish reason, shared with the engine: it adds end-of-text and length, we add stops
        constraints = [self.constraint(row) for row in range(len(self.rows))]
        self._steps = decode_steps(
            self.engine, self.rows, self.config, self.generators(), self.pad_id, finished, constraints
        )
        try:
            for tokens, logits in self._steps:
                logprobs = log_softmax(logits) if self.config.logprobs is not None else None
                for row, token in enumerate(tokens.tolist()):
                    if token < 0:  # finished before this step
                        continue
                    text, reason = self.take(row, token, None if logprobs is None else logprobs[row], finished.get(row))
                    if reason is not None:
                        finished[row] = reason  # a stop string: the engine decodes this row no further
                    if text:
                        yield Piece(row, text)
        finally:
            self.close()
        self.completions = self._results

    def collect(self) -> list:
        """Fill and return `completions` once every row has finished: for a driver other than iteration (the
        continuous-batching scheduler, runtime/batching/scheduler.py) that feeds each row's ids to take()."""
        self.completions = self._results
        return self.completions

    def constraint(self, row: int):
        """A fresh matcher for row `row`'s constraint (a RowConstraint), or None for an unconstrained row."""
        grammar = self._grammars[row]
        return None if grammar is None else grammar.row()

    def generators(self) -> list:
        """One random generator per row, seeded from (seed, sequence index): a row's draws depend on nothing else."""
        n, seed = self.config.num_return_sequences, self.config.seed
        return [np.random.default_rng(None if seed is None else [seed, r % n]) for r in range(len(self.rows))]

    def take(self, row: int, token: int, logprobs: np.ndarray | None, reason: str | None) -> tuple[str, str | None]:
        """Row `row`'s next id (logprobs: the row's log-softmax [V], with logprobs on) -> (the text that became
        final, the finish reason or None). `reason` is the decode loop's: "stop" for end-of-text (not part of
        the text) or a finished constraint (its last token is), "length" at max_new_tokens; a stop string in the
        text makes it "stop". A finished row's Completion is made here."""
        ends = reason == "stop" and token in self.stop_ids[row]
        text = "" if ends else self._accept(row, token, logprobs)
        if self._streams[row].stopped:
            reason = "stop"
        if reason is not None:
            text += self._streams[row].finish()
            self._finish(row, reason)
        return text, reason

    def _context(self, prompt: list) -> list:
        """The prompt's last ids, cut back to a whole character: a token-id prompt may end mid-character,
        and then the bytes that complete it belong to the completion's text, as decode(token_ids) shows them."""
        context = list(prompt[-PREFIX_TOKENS:])
        while context and decode(self.tokenizer, context).endswith("\ufffd"):
            context.pop()
        return context

    def _accept(self, row: int, token: int, logprobs: np.ndarray | None) -> str:
        self._tokens[row].append(token)
        if logprobs is not None:  # the model's own log-probabilities, before any sampling filter but the constraint
            # (a constrained row's are its distribution over the tokens its grammar allows: none of -inf is listed)
            top = [(i, v) for i, v in zip(*top_logprobs(logprobs, self.config.logprobs)) if v != -np.inf]
            self._logprobs[row].append(
                {
                    "token_id": token,
                    "token": decode(self.tokenizer, [token]),
                    "logprob": float(logprobs[token]),
                    "top_logprobs": [
                        {"token_id": int(i), "token": decode(self.tokenizer, [int(i)]), "logprob": float(v)}
                        for i, v in top
                    ],
                }
            )
        return self._streams[row].push(token)

    def _finish(self, row: int, reason: str) -> None:
        stream, prompt_index = self._streams[row], row // self.config.num_return_sequences
        self._results[row] = Completion(
            text=stream.text,
            token_ids=self._tokens[row],
            finish_reason=reason,
            prompt_tokens=len(self.rows[row]),
            completion_tokens=len(self._tokens[row]),
            index=row,
            prompt_index=prompt_index,
            stop_string=stream.stop_string,
            truncated_prompt_tokens=self.truncated[prompt_index] if self.truncated else 0,
            logprobs=self._logprobs[row],
            parsed=_parsed(self._grammars[row], stream.text, reason, stream.stop_string),
            constraint=None if self._grammars[row] is None else self._grammars[row].kind,
        )

    def close(self) -> None:
        if self._steps is not None:
            self._steps.close()

    def logprobs_so_far(self, row: int) -> list | None:
        """Row `row`'s log-prob entries, one per token accepted so far (None without logprobs): a server that
        streams sends each text piece with the entries of the tokens it covers."""
        return self._logprobs[row]

    def run(self) -> list:
        """Run to the end and return the completions."""
        for _ in self:
            pass
        return self.completions


def _parsed(grammar, text: str, reason: str, stop_string: str | None):
    """A constrained row's value (Completion.parsed), or None where it was cut or has none to parse."""
    if grammar is None or reason != "stop" or stop_string is not None:
        return None
    if grammar.kind == "choices":
        return text
    if grammar.kind in ("json_schema", "json_object"):
        try:
            return json.loads(text)
        except ValueError:  # cut by something the grammar did not foresee: the text says what there is
            return None
    return None


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
