"""Chat request bodies in: the pydantic model of POST /v1/chat/completions and the runtime options it becomes.

Shapes only, as in requests.py (strict types, unknown fields refused); the messages themselves are checked by
the package's chat template (chat_template.check_messages), whose ChatError names the field ("messages[1].role").

OpenAI's chat fields on top of the completions ones:
    max_completion_tokens (or the older max_tokens) -> max_new_tokens; neither: what the context leaves after
        the rendered conversation, up to --max-tokens-limit (OpenAI's chat has no fixed default either)
    logprobs: true -> the chosen tokens' log-probs; top_logprobs: N (0..20) -> and the N most likely alternatives
    tools, tool_choice, parallel_tool_calls -> tool_calls.py; response_format -> structured.py
    the fields with no local meaning, and those refused: fields.py
"""

import secrets
from dataclasses import dataclass, field
from typing import Any

from pydantic import Field

from ...inputs import text_problem
from ..api_errors import ApiError
from .fields import CHAT_REFUSED, ChatExtras, refuse
from .requests import (
    GenerationRequest,
    Limits,
    ModelNames,
    SamplingBody,
    check_max_tokens,
    check_tokens_held,
    given_fields,
    sampling_request,
)
from .schema import validate
from .structured import refuse_stop
from .tool_calls import ToolUse, answer_format, tool_use

MESSAGES = 'a list of messages like {"role": "user", "content": "Hi"}'


class ChatBody(SamplingBody, ChatExtras):
    """POST /v1/chat/completions."""

    messages: Any = Field(None, description=MESSAGES)  # checked by the chat template, which names the bad field
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: Any = None  # checked by the text layer (chat_messages.check_tools), which names the bad field
    tool_choice: Any = None
    parallel_tool_calls: Any = None


@dataclass(kw_only=True)
class ChatRequest(GenerationRequest):
    """One parsed /v1/chat/completions body: the messages, the runtime options, and how to shape the answer."""

    messages: Any  # as sent; the chat template checks them
    default_max_tokens: int  # without max_tokens: what the context leaves after the prompt, up to this
    logprobs: bool = False
    tools: ToolUse = field(default_factory=ToolUse)
    tool_format: object = None  # the package's ToolFormat (runtime/text/tools.py), set once tools are in use
    answer_format: dict = field(default_factory=dict)  # with tools under "auto": the JSON a non-call answer must be
    id: str = field(default_factory=lambda: "chatcmpl-" + secrets.token_hex(12))

    def field_of(self, option: str | None) -> str | None:
        """The request field a runtime option came from, for the error's `param`."""
        if option == "max_new_tokens":
            return "max_completion_tokens" if "max_completion_tokens" in self.given else "max_tokens"
        if option == "logprobs":
            return "top_logprobs"
        if option == "prompt":  # the rendered conversation: what the client sent is its messages
            return "messages"
        if option == "grammar":  # the constraint a forced tool call compiles to
            return "tool_choice"
        return super().field_of(option)


def parse_chat_request(body, names: ModelNames, vocab_size: int, limits: Limits) -> ChatRequest:
    """Check a decoded JSON body's shape and the server's limits; raises ApiError naming the bad field.
    The messages are checked when the template renders them, the options' ranges by model.settings."""
    parsed = validate(ChatBody, body)
    given = given_fields(parsed)
    names.check(parsed.model)
    refuse(parsed, CHAT_REFUSED)
    if parsed.messages is None:
        raise ApiError(400, f"messages is required: {MESSAGES}", "messages")
    _check_text(parsed.messages)
    if "max_tokens" in given and "max_completion_tokens" in given and parsed.max_tokens != parsed.max_completion_tokens:
        raise ApiError(
            400, "give max_completion_tokens or max_tokens, not both (they are the same option)", "max_tokens"
        )
    max_tokens = parsed.max_completion_tokens if parsed.max_completion_tokens is not None else parsed.max_tokens
    check_max_tokens(max_tokens, "max_completion_tokens" if "max_completion_tokens" in given else "max_tokens", limits)
    shared = sampling_request(parsed, given, vocab_size, limits)
    if "top_logprobs" in given and not parsed.logprobs:
        raise ApiError(400, "top_logprobs needs logprobs: true", "top_logprobs")
    tools = tool_use(parsed.tools, parsed.tool_choice, parsed.parallel_tool_calls)
    refuse_stop(shared["options"], "a tool_choice that forces a call" if tools.forced else None)
    shared["answer_format"] = answer_format(tools, shared["options"], "response_format")
    shared["options"]["max_new_tokens"] = max_tokens or 1
    if parsed.logprobs:
        shared["options"]["logprobs"] = parsed.top_logprobs or 0
    request = ChatRequest(
        messages=parsed.messages,
        max_tokens=max_tokens,
        default_max_tokens=limits.max_tokens,
        logprobs=bool(parsed.logprobs),
        tools=tools,
        **shared,
    )
    check_tokens_held(request, [1], limits)  # the bound before the template runs; again after
    return request


def _check_text(messages) -> None:
    """JSON can carry a lone UTF-16 surrogate that is no Unicode text: refuse it before the template sees it."""
    problem = text_problem(messages, "messages")
    if problem:
        raise ApiError(400, problem, "messages", "invalid_text")
