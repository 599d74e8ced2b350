"""The rows of one call and what each has produced: the state both decode drivers feed, token by token.

A call's rows are its prompts x num_return_sequences, prompt-major. Each row has its own TextStream (UTF-8-safe,
stop strings cut), its own random generator seeded from (seed, sequence index), so a row's tokens do not depend on
what else shares its batch, and its constraint's matcher. A driver (Batch's iteration, runtime/batching/batch.py;
the continuous-batching scheduler, runtime/batching/scheduler.py) picks each row's next id and hands it to take(),
which returns the text that became final and ends the row at end-of-text, a stop string or its length.
Rows decodes nothing itself.
"""

import json
from dataclasses import dataclass

import numpy as np

from ..generation_config import GenerationConfig
from ..sampling import top_logprobs
from ..text.stream import TextStream
from ..text.tokenizer import decode

PREFIX_TOKENS = 4  # prompt ids a text stream sees as context for its first pieces


def row_stop_ids(stop_ids: tuple, grammar) -> tuple:
    """A row's end ids: the settings' (GenerationConfig.stop_ids: none with ignore_eos); for a constrained row, its
    grammar's end-of-text ids alone (`grammar`: a compiled Grammar, or None). The mask allows those only where the
    grammar may end, and a finished grammar ends the row whatever ignore_eos says; any other id the settings name
    is, to the grammar, one more token of the output, so it cannot cut the output short."""
    if grammar is None:
        return stop_ids
    return tuple(grammar.eos_ids)


@dataclass
class Completion:
    """A finished row: text, token ids, why it stopped, token counts, and log-probs when asked for."""

    text: str
    token_ids: list  # the generated ids the text was decoded from (end-of-text itself is not included)
    finish_reason: str  # "stop": end-of-text or a stop string; "length": max_new_tokens reached; "error": see error
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
    # what ended this row alone (its constraint, the sampler on its row, its text), with finish_reason "error": the
    # call's other rows are as they would be without it
    error: Exception | None = None
    # with several tokens per pass (runtime/speculative/): {"drafted", "accepted", "forced", "passes",
    # "acceptance_rate"}; None when the row was decoded one token per pass
    speculation: dict | None = None

    def to_dict(self) -> dict:
        """The fields as a dict; an unconstrained row's has neither parsed nor constraint, a row that did not fail
        no error (else its message)."""
        fields = dict(self.__dict__)
        if self.constraint is None:
            del fields["parsed"], fields["constraint"]
        if self.error is None:
            del fields["error"]
        else:
            fields["error"] = str(self.error)
        if self.speculation is None:
            del fields["speculation"]
        return fields


@dataclass
class Piece:
    """Text that became final for one row during a step."""

    index: int
    text: str


class Rows:
    """The rows of one call: their prompt ids (rows[i]), settings, generators and constraints, and their output."""

    def __init__(self, tokenizer, prompts: list, config: GenerationConfig, truncated=(), grammars=()):
        """prompts: token ids per prompt, already checked and truncated; truncated: dropped prompt tokens per
        prompt; grammars: per prompt its compiled constraint (runtime/sampling/constraint.py Grammar) or None,
        empty for none at all. tokenizer None: ids only, no text (Completion.text stays empty)."""
        n = config.num_return_sequences
        self.tokenizer, self.config, self.truncated, self.grammars = tokenizer, config, list(truncated), list(grammars)
        self.ids = [p for p in prompts for _ in range(n)]
        self._grammars = [g for g in self.grammars for _ in range(n)] if self.grammars else [None] * len(self.ids)
        # the ids that end each row: a constrained row's grammar end as well as the settings'
        self.stop_ids = [row_stop_ids(config.stop_ids, g) for g in self._grammars]
        self._streams = [
            _NoText() if tokenizer is None else TextStream(tokenizer, config.stop, self._context(r)) for r in self.ids
        ]
        self._tokens = [[] for _ in self.ids]
        self._logprobs = [[] if config.logprobs is not None else None for _ in self.ids]
        self._results = [None] * len(self.ids)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, row: int) -> list:
        return self.ids[row]

    @property
    def completions(self) -> list:
        """One Completion per row, in row order, once every row has finished."""
        return self._results if all(r is not None for r in self._results) else []

    def constraint(self, row: int):
        """A fresh matcher for row `row`'s constraint (a RowConstraint), or None for an unconstrained row."""
        grammar = self._grammars[row]
        return None if grammar is None else grammar.row()

    def generators(self) -> list:
        """One random generator per row, seeded from (seed, sequence index): a row's draws depend on nothing else."""
        n, seed = self.config.num_return_sequences, self.config.seed
        return [np.random.default_rng(None if seed is None else [seed, r % n]) for r in range(len(self.ids))]

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

    def fail(self, row: int, error: Exception) -> None:
        """Row `row` ends with `error` (finish reason "error"), with what it produced so far."""
        self._finish(row, "error", error)

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

    def _finish(self, row: int, reason: str, error: Exception | None = None) -> None:
        stream, prompt_index = self._streams[row], row // self.config.num_return_sequences
        self._results[row] = Completion(
            text=stream.text,
            token_ids=self._tokens[row],
            finish_reason=reason,
            prompt_tokens=len(self.ids[row]),
            completion_tokens=len(self._tokens[row]),
            index=row,
            prompt_index=prompt_index,
            stop_string=stream.stop_string,
            truncated_prompt_tokens=self.truncated[prompt_index] if self.truncated else 0,
            logprobs=self._logprobs[row],
            parsed=_parsed(self._grammars[row], stream.text, reason, stream.stop_string),
            constraint=None if self._grammars[row] is None else self._grammars[row].kind,
            error=error,
        )

    def logprobs_so_far(self, row: int) -> list | None:
        """Row `row`'s log-prob entries, one per token accepted so far (None without logprobs): a server that
        streams sends each text piece with the entries of the tokens it covers."""
        return self._logprobs[row]


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


class _NoText:
    """A text stream for rows of ids only: no text, no stop strings."""

    stopped, stop_string, text = False, None, ""

    def push(self, token: int) -> str:
        return ""

    def finish(self) -> str:
        return ""
