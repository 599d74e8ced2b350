"""Chat response bodies out: pydantic models of OpenAI's `chat.completion` and `chat.completion.chunk` shapes.

chat.completion        choices[i] = {index, message: {role: "assistant", content}, logprobs, finish_reason}
chat.completion.chunk  choices[i] = {index, delta: {role?, content?}, logprobs, finish_reason}; the first
                       chunk of a choice carries {"role": "assistant", "content": ""}, its last the
                       finish_reason and an empty delta; `usage` is null except in the final usage chunk
logprobs               {"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}
"""

import math

from pydantic import BaseModel

from .chat_requests import ChatRequest
from .responses import Usage

MISSING_LOGPROB = -9999.0  # OpenAI's value for a log-prob of minus infinity (JSON has no -Infinity)


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprob] | None


class Message(BaseModel):
    role: str = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int
    message: Message
    logprobs: ChoiceLogprobs | None = None
    finish_reason: str | None


class ChunkChoice(BaseModel):
    index: int
    delta: dict  # only the keys that change: {"role", "content"} first, then {"content"}, then {}
    logprobs: ChoiceLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletion(BaseModel):
    id: str
    object: str = "chat.completion"
    created: int
    model: str
    system_fingerprint: str | None = None
    choices: list[ChatChoice]
    usage: Usage


class ChatChunk(BaseModel):
    id: str
    object: str = "chat.completion.chunk"
    created: int
    model: str
    system_fingerprint: str | None = None
    choices: list[ChunkChoice]
    usage: Usage | None = None


def answer(text: str) -> str:
    """The assistant's content: without the leading whitespace the default template's answers begin with."""
    return text.lstrip()


def logprobs(request: ChatRequest, entries: list | None) -> ChoiceLogprobs | None:
    """The runtime's per-token entries ({"token", "logprob", "top_logprobs": [...]}) in OpenAI's chat shape;
    None when the request did not ask for logprobs."""
    if not request.logprobs:
        return None
    return ChoiceLogprobs(
        content=[
            TokenLogprob(
                **_top(entry),
                top_logprobs=[TopLogprob(**_top(alternative)) for alternative in entry["top_logprobs"] or []],
            )
            for entry in entries or []
        ]
    )


def completion(request: ChatRequest, model_id: str, completions: list, usage: Usage) -> ChatCompletion:
    choices = [
        ChatChoice(
            index=c.index,
            message=Message(content=answer(c.text)),
            logprobs=logprobs(request, c.logprobs),
            finish_reason=c.finish_reason,
        )
        for c in completions
    ]
    return ChatCompletion(id=request.id, created=request.created, model=model_id, choices=choices, usage=usage)


def chunk(request: ChatRequest, model_id: str, choices: list, usage: Usage | None = None) -> ChatChunk:
    return ChatChunk(id=request.id, created=request.created, model=model_id, choices=choices, usage=usage)


def _top(entry: dict) -> dict:
    value = entry["logprob"]
    return {
        "token": entry["token"],
        "logprob": float(value) if value is not None and math.isfinite(value) else MISSING_LOGPROB,
        "bytes": list(entry["token"].encode("utf-8")),
    }
