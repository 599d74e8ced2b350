"""Response bodies out: pydantic models of OpenAI's completion shapes (and edgelm's score), built from Completions.

A streamed answer is a series of `TextCompletion` chunks with the same id: each carries a few choices, and
`usage` is null in all but the last one when stream_options.include_usage asks for it (OpenAI's shape). When
several tokens were decoded per pass (runtime/speculative/), `usage.speculation` = {drafted, accepted,
acceptance_rate} says how many tokens were proposed and accepted (edgelm's extension: absent otherwise).
"""

import math

from pydantic import BaseModel, ConfigDict

from .requests import CompletionRequest


class Usage(BaseModel):
    model_config = ConfigDict(extra="allow")  # `speculation`, only where a row speculated

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class Logprobs(BaseModel):
    """OpenAI's legacy shape: per token its text, log-prob, top alternatives {token: logprob}, and offset."""

    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float | None] | None]
    text_offset: list[int]

    def __add__(self, other: "Logprobs | None") -> "Logprobs":
        """The prompt's entries (echo) followed by the completion's."""
        if other is None:
            return self
        return Logprobs(
            tokens=self.tokens + other.tokens,
            token_logprobs=self.token_logprobs + other.token_logprobs,
            top_logprobs=self.top_logprobs + other.top_logprobs,
            text_offset=self.text_offset + other.text_offset,
        )


class Choice(BaseModel):
    text: str
    index: int
    logprobs: Logprobs | None = None
    finish_reason: str | None = None


class TextCompletion(BaseModel):
    """A whole response, or (stream) one chunk: same object, same id, a few choices at a time."""

    id: str
    object: str = "text_completion"
    created: int
    model: str
    choices: list[Choice]
    usage: Usage | None = None


class ScoreUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class TextScore(BaseModel):
    """POST /v1/score: each token of the text with its log-prob under the model, and the perplexity."""

    object: str = "score"
    model: str
    tokens: list[str]
    token_ids: list[int]
    token_logprobs: list[float | None]
    perplexity: float | None
    usage: ScoreUsage


def choices(request: CompletionRequest, completions: list | None, scores: list | None) -> list:
    """One choice per (prompt, sequence), index = prompt_index * n + sequence, as OpenAI numbers them.

    completions: the Batch's, or None when max_tokens is 0; scores: each prompt's Score when
    echo and logprobs are both asked for (the prompt's own log-probs come first), else None.
    """
    out = []
    for index in range(len(request.prompts) * request.n):
        prompt_index = index // request.n
        prompt = request.prompt_texts[prompt_index]
        completion = completions[index] if completions else None
        text = (prompt if request.echo else "") + (completion.text if completion else "")
        finish_reason = completion.finish_reason if completion else "length"
        echoed = prompt_entries(scores[prompt_index] if scores else None)
        generated = (completion.logprobs or []) if completion else []
        out.append(
            Choice(
                text=text,
                index=index,
                logprobs=echo_and_completion(request, echoed, generated, len(prompt)),
                finish_reason=finish_reason,
            )
        )
    return out


def choice(index: int, text: str, logprobs: Logprobs | None = None, finish_reason: str | None = None) -> Choice:
    return Choice(text=text, index=index, logprobs=logprobs, finish_reason=finish_reason)


def echo_and_completion(request: CompletionRequest, echoed: list, generated: list, prompt_length: int):
    """The log-probs of the prompt's tokens (echo; offsets from 0) then the completion's (from the prompt's end)."""
    first = logprobs(request, echoed, 0)
    return None if first is None else first + logprobs(request, generated, prompt_length)


def prompt_entries(score) -> list:
    """A prompt's Score (echo) as the runtime's per-token entries: each prompt token is conditioned on what
    precedes it; where nothing does (a token-id prompt's first token) its log-prob and top_logprobs are null."""
    if score is None:
        return []
    tops = score.top_logprobs or [[] for _ in score.tokens]
    return [
        {"token": token, "logprob": value, "top_logprobs": top}
        for token, value, top in zip(score.tokens, score.logprobs, tops)
    ]


def logprobs(request: CompletionRequest, entries: list, at: int) -> Logprobs | None:
    """OpenAI's legacy shape for runtime entries ({"token", "logprob", "top_logprobs": [...] or None}), None
    when the request asked for no logprobs. text_offset counts characters from the start of the prompt, as
    OpenAI does: `at` is where the first entry's text begins. top_logprobs holds the N most likely tokens and
    the chosen one when it is not among them (up to logprobs + 1 entries, as OpenAI)."""
    if request.logprobs is None:
        return None
    tokens, values, tops, offsets = [], [], [], []
    for entry in entries:
        value = _finite(entry["logprob"])
        tokens.append(entry["token"])
        values.append(value)
        offsets.append(at)
        at += len(entry["token"])
        if value is None or entry["top_logprobs"] is None:
            tops.append(None)
            continue
        top = {}
        for alternative in entry["top_logprobs"]:  # most likely first; tokens that print alike keep the first
            top.setdefault(alternative["token"], _finite(alternative["logprob"]))
        top.setdefault(entry["token"], value)
        tops.append(top)
    return Logprobs(tokens=tokens, token_logprobs=values, top_logprobs=tops, text_offset=offsets)


def usage(prompt_tokens: int, completion_tokens: int, speculation: dict | None = None) -> Usage:
    """OpenAI's usage; with `speculation` (Result.speculation) its extension field as well."""
    extension = {} if speculation is None else {"speculation": speculation}
    return Usage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
        **extension,
    )


def completion(request: CompletionRequest, model_id: str, choices: list, usage: Usage | None = None) -> TextCompletion:
    return TextCompletion(id=request.id, created=request.created, model=model_id, choices=choices, usage=usage)


def score(text_score, model_id: str) -> TextScore:
    count = len(text_score.token_ids)
    return TextScore(
        model=model_id,
        tokens=text_score.tokens,
        token_ids=text_score.token_ids,
        token_logprobs=[_finite(v) for v in text_score.logprobs],
        perplexity=_finite(text_score.perplexity),
        usage=ScoreUsage(prompt_tokens=count, total_tokens=count),
    )


def _finite(value):
    """JSON has no NaN: a log-prob that does not exist (nothing to condition on) is null."""
    return float(value) if value is not None and math.isfinite(value) else None
