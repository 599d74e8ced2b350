"""A batch: the rows of one call, decoded together, one layer above the engine: prompts in, text pieces and finished completions out.

Rows are prompts x num_return_sequences, prompt-major. Each row has its own text stream (UTF-8-safe,
stop strings cut) and its own random generator seeded from (seed, sequence index), so a row's tokens do
not depend on what else shares its batch.
"""

from dataclasses import dataclass, field

import numpy as np

from .generation_config import GenerationConfig
from .engine import decode_steps
from .text_stream import TextStream

PREFIX_TOKENS = 4  # prompt ids a text stream sees as context for its first pieces


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

    def to_dict(self) -> dict:
        return dict(self.__dict__)


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

    def __post_init__(self):
        n = self.config.num_return_sequences
        self.rows = [p for p in self.prompts for _ in range(n)]
        self._streams = [TextStream(self.tokenizer, self.config.stop, self._context(r)) for r in self.rows]
        self._tokens = [[] for _ in self.rows]
        self._logprobs = [[] if self.config.logprobs is not None else None for _ in self.rows]
        self._results = [None] * len(self.rows)
        self._steps = None

    def __iter__(self):
        rngs = [
            np.random.default_rng(
                None if self.config.seed is None else [self.config.seed, r % self.config.num_return_sequences]
            )
            for r in range(len(self.rows))
        ]
        self._steps = decode_steps(self.engine, self.rows, self.config, rngs, self.pad_id)
        try:
            for step in self._steps:
                for row, token in enumerate(step.tokens.tolist()):
                    if token < 0 or self._results[row] is not None:
                        continue
                    reason = step.finish_reasons[row]
                    text = "" if reason == "stop" else self._accept(row, token, step)
                    if self._streams[row].stopped:
                        reason = "stop"
                    if reason is not None:
                        text += self._streams[row].finish()
                        self._finish(row, reason)
                    if text:
                        yield Piece(row, text)
                if all(r is not None for r in self._results):
                    break
        finally:
            self.close()
        self.completions = self._results

    def _context(self, prompt: list) -> list:
        """The prompt's last ids, cut back to a whole character: a token-id prompt may end mid-character,
        and then the bytes that complete it belong to the completion's text, as decode(token_ids) shows them."""
        context = list(prompt[-PREFIX_TOKENS:])
        while context and self.tokenizer.decode(context).endswith("\ufffd"):
            context.pop()
        return context

    def _accept(self, row: int, token: int, step) -> str:
        self._tokens[row].append(token)
        if self._logprobs[row] is not None:
            chosen, top = step.logprobs[row]
            self._logprobs[row].append(
                {
                    "token_id": token,
                    "token": self.tokenizer.decode([token]),
                    "logprob": chosen,
                    "top_logprobs": [
                        {"token_id": int(i), "token": self.tokenizer.decode([int(i)]), "logprob": float(v)}
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
