"""Chat response bodies out: pydantic models of OpenAI's `chat.completion` and `chat.completion.chunk` shapes.

chat.completion        choices[i] = {index, message: {role: "assistant", content, refusal, tool_calls}, logprobs,
                       finish_reason}; with calls, content is null when they took the whole answer and
                       finish_reason is "tool_calls" ("length" where max_tokens cut the answer)
chat.completion.chunk  choices[i] = {index, delta: {role?, content?, tool_calls?}, logprobs, finish_reason}; the
                       first chunk of a choice carries {"role": "assistant", "content": ""}, its last the
                       finish_reason and an empty delta; `usage` is null except in the final usage chunk;
                       a call is two deltas: [{index, id, type, function: {name, arguments: ""}}], then
                       [{index, function: {arguments}}], which the openai client joins
logprobs               {"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}
"""

import math

from pydantic import BaseModel

from .chat_requests import ChatRequest
from .completion_answers import Usage
from .tool_calls import finish_reason

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
    content: str | None
    refusal: str | None = None  # edgelm's models never refuse by a separate channel
    tool_calls: list[dict] | None = None  # OpenAI's {"id", "type": "function", "function": {"name", "arguments"}}


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


def completion(request: ChatRequest, model_id: str, completions: list, usage: Usage, fmt=None) -> ChatCompletion:
    """The whole answer; `fmt` (the package's ToolFormat, when the request's tools are in use) reads calls from it."""
    choices = []
    for c in completions:
        content, calls = request.tools.read(fmt, c.text, cut=c.finish_reason == "length")
        message = Message(
            content=None if content is None else answer(content),
            tool_calls=[call.as_openai() for call in calls] or None,
        )
        reason = finish_reason(c.finish_reason, len(calls))
        choices.append(
            ChatChoice(index=c.index, message=message, logprobs=logprobs(request, c.logprobs), finish_reason=reason)
        )
    return ChatCompletion(id=request.id, created=request.created, model=model_id, choices=choices, usage=usage)


def chunk(request: ChatRequest, model_id: str, choices: list, usage: Usage | None = None) -> ChatChunk:
    return ChatChunk(id=request.id, created=request.created, model=model_id, choices=choices, usage=usage)


def logprobs_entry(entry: dict) -> dict:
    """One runtime entry as OpenAI's {token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]} (the
    Responses API's shape too)."""
    alternatives = [TopLogprob(**_top(alternative)) for alternative in entry["top_logprobs"] or []]
    return TokenLogprob(**_top(entry), top_logprobs=alternatives).model_dump()


def call_deltas(delta) -> dict:
    """A text-layer ToolCallDelta as a chunk's delta: the first part of a call names it, the next its arguments."""
    call = {"index": delta.index}
    if delta.id is not None:
        call.update(id=delta.id, type="function", function={"name": delta.name, "arguments": delta.arguments})
    else:
        call["function"] = {"arguments": delta.arguments}
    return {"tool_calls": [call]}


def _top(entry: dict) -> dict:
    value = entry["logprob"]
    return {
        "token": entry["token"],
        "logprob": float(value) if value is not None and math.isfinite(value) else MISSING_LOGPROB,
        "bytes": list(entry["token"].encode("utf-8")),
    }
