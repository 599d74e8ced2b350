"""Scoring: the log-probability of every token of a text under the model, and its perplexity."""

from dataclasses import dataclass

import numpy as np

from ..errors import GenerationOptionError, PromptError
from ..sampling import log_softmax
from ..sampling import top_logprobs as most_likely
from ..text import tokenizer as tokenizing


@dataclass
class Score:
    """Per-token log-probabilities of a text under the model, and its perplexity."""

    token_ids: list
    tokens: list  # each token's own text
    logprobs: list  # log p(token | everything before it); the first token is conditioned on end-of-text
    perplexity: float
    top_logprobs: list | None = None  # per token, with top_logprobs=N: [{"token_id", "token", "logprob"}, ...]

    def to_dict(self) -> dict:
        return dict(self.__dict__)


class Scoring:
    """Model.score(): one forward pass over a whole text, every position's logits kept."""

    def score(self, text, top_logprobs: int | None = None) -> Score:
        """Log-probability of every token of `text` and the perplexity. A string is conditioned on end-of-text
        first (when the model has a start token); a list of token ids is scored as given, so its first token has
        nothing to be conditioned on (NaN). top_logprobs=N also gives each token the N most likely tokens at its
        position, from the same distribution (None where its log-prob is NaN)."""
        if top_logprobs is not None and (
            not isinstance(top_logprobs, (int, np.integer)) or isinstance(top_logprobs, bool) or top_logprobs < 0
        ):
            raise GenerationOptionError(
                f"top_logprobs must be None or an integer >= 0, got {str(top_logprobs)[:40]}", param="top_logprobs"
            )
        given_ids = isinstance(text, (list, tuple))
        ids = list(text) if given_ids else self.encode(text)
        if not ids:
            raise PromptError("score() needs a non-empty text")
        start = [self.arch.bos_token_id] if self.arch.bos_token_id is not None and not given_ids else []
        full = start + ids
        if len(full) > self.arch.n_positions:
            raise PromptError(
                f"the text is {len(ids)} tokens; scoring covers at most {self.arch.n_positions - len(start)} (the model's context). Score it in parts."
            )
        self._check_ids(full)
        row = np.asarray([full], dtype=np.int64)
        mask = np.ones_like(row)
        logits, _ = self.engine.forward(
            row, mask, np.arange(row.shape[1])[None], self.engine.empty_past(1), logits_to_keep=0
        )
        table = log_softmax(logits[0, :-1])  # [S - 1, V]: position i's distribution over token i + 1
        logprobs = table[np.arange(len(full) - 1), full[1:]].astype(float)
        if not start:  # the first token has nothing to be conditioned on
            logprobs = np.concatenate([[np.nan], logprobs])
        scored = logprobs[~np.isnan(logprobs)]
        tops = None
        if top_logprobs is not None:
            tops = [None] * (len(ids) - len(table)) + [
                [
                    {"token_id": int(i), "token": tokenizing.decode(self.tokenizer, [int(i)]), "logprob": float(v)}
                    for i, v in zip(*most_likely(position, top_logprobs))
                ]
                for position in table
            ]
        return Score(
            ids,
            [tokenizing.decode(self.tokenizer, [i]) for i in ids],
            logprobs.tolist(),
            float(np.exp(-scored.mean())) if len(scored) else float("nan"),
            tops,
        )
