"""Chat request bodies in: the pydantic model of POST /v1/chat/completions and the runtime options it becomes.

Shapes only, as in requests.py (strict types, unknown fields refused); the messages themselves are checked by
the package's chat template (chat_template.check_messages), whose ChatError names the field ("messages[1].role").

OpenAI's chat fields on top of the completions ones:
    max_completion_tokens (or the older max_tokens) -> max_new_tokens; neither: what the context leaves after
        the rendered conversation, up to --max-tokens-limit (OpenAI's chat has no fixed default either)
    logprobs: true -> the chosen tokens' log-probs; top_logprobs: N (0..20) -> and the N most likely alternatives
"""

import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from pydantic import Field

from ..inputs import text_problem
from .errors import ApiError
from .requests import (
    OPENAI_DEFAULTS,
    PASSTHROUGH,
    Limits,
    ModelNames,
    SamplingBody,
    _logit_bias,
    _validate,
    check_tokens_held,
)

MESSAGES = 'a list of messages like {"role": "user", "content": "Hi"}'


class ChatBody(SamplingBody):
    """POST /v1/chat/completions."""

    messages: Any = Field(None, description=MESSAGES)  # checked by the chat template, which names the bad field
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None


@dataclass
class ChatRequest:
    """One parsed /v1/chat/completions body: the messages, the runtime options, and how to shape the answer."""

    messages: Any  # as sent; the chat template checks them
    options: dict  # runtime option names (GenerationConfig)
    max_tokens: int | None  # None: what the context leaves after the prompt, up to `default_max_tokens`
    default_max_tokens: int
    n: int = 1
    stream: bool = False
    include_usage: bool = False
    logprobs: bool = False
    given: frozenset = frozenset()
    id: str = field(default_factory=lambda: "chatcmpl-" + secrets.token_hex(12))
    created: int = field(default_factory=lambda: int(time.time()))

    def field_of(self, option: str) -> str:
        """The request field a runtime option came from, for the error's `param`."""
        if option == "max_new_tokens":
            return "max_completion_tokens" if "max_completion_tokens" in self.given else "max_tokens"
        if option == "min_new_tokens":
            return "min_tokens" if "min_tokens" in self.given else "min_new_tokens"
        if option == "logprobs":
            return "top_logprobs"
        return {"num_return_sequences": "n", "do_sample": "temperature"}.get(option, option)

    def tokens_held(self, prompt_tokens: list) -> int:
        """Tokens this request's rows hold at their longest: n x (prompt + max_tokens)."""
        return self.n * sum(count + (self.max_tokens or 1) for count in prompt_tokens)


def parse_chat_request(body, names: ModelNames, vocab_size: int, limits: Limits) -> ChatRequest:
    """Check a decoded JSON body's shape and the server's limits; raises ApiError naming the bad field.
    The messages are checked when the template renders them, the options' ranges by model.settings."""
    parsed = _validate(ChatBody, body)
    given = {name for name in parsed.model_fields_set if getattr(parsed, name) is not None}
    names.check(parsed.model)
    if parsed.messages is None:
        raise ApiError(400, f"messages is required: {MESSAGES}", "messages")
    _check_text(parsed.messages)
    if "max_tokens" in given and "max_completion_tokens" in given and parsed.max_tokens != parsed.max_completion_tokens:
        raise ApiError(
            400, "give max_completion_tokens or max_tokens, not both (they are the same option)", "max_tokens"
        )
    max_tokens = parsed.max_completion_tokens if parsed.max_completion_tokens is not None else parsed.max_tokens
    name = "max_completion_tokens" if "max_completion_tokens" in given else "max_tokens"
    if max_tokens is not None and max_tokens < 1:
        raise ApiError(400, f"{name} must be >= 1, got {max_tokens}", name)
    if max_tokens is not None and max_tokens > limits.max_tokens:
        raise ApiError(
            400, f"{name} is {max_tokens}; this server allows at most {limits.max_tokens} (--max-tokens-limit)", name
        )
    n = 1 if parsed.n is None else parsed.n
    if not 1 <= n <= limits.max_n:
        raise ApiError(400, f"n must be from 1 to {limits.max_n} on this server (--max-n), got {n}", "n")
    stream = bool(parsed.stream)
    if parsed.stream_options is not None and not stream:
        raise ApiError(400, "stream_options is only allowed with stream: true", "stream_options")
    if "top_logprobs" in given and not parsed.logprobs:
        raise ApiError(400, "top_logprobs needs logprobs: true", "top_logprobs")
    if "min_tokens" in given and "min_new_tokens" in given:
        raise ApiError(400, "give min_tokens or min_new_tokens, not both (they are the same option)", "min_tokens")

    temperature = 1.0 if parsed.temperature is None else parsed.temperature
    passed = [k for k in PASSTHROUGH if k != "logprobs"]
    options = {**OPENAI_DEFAULTS, **{k: getattr(parsed, k) for k in passed if k in given}}
    options.update(max_new_tokens=max_tokens or 1, num_return_sequences=n, do_sample=temperature != 0)
    if temperature != 0:
        options["temperature"] = temperature  # a negative one is refused by the runtime's check
    if parsed.logprobs:
        options["logprobs"] = parsed.top_logprobs or 0
    if "logit_bias" in given:
        options["logit_bias"] = _logit_bias(parsed.logit_bias, vocab_size)
    for option in ("min_tokens", "min_new_tokens"):
        if option in given:
            options["min_new_tokens"] = getattr(parsed, option)
    request = ChatRequest(
        parsed.messages,
        options,
        max_tokens,
        limits.max_tokens,
        n,
        stream,
        bool(parsed.stream_options and parsed.stream_options.include_usage),
        bool(parsed.logprobs),
        frozenset(given),
    )
    check_tokens_held(request, [1], limits)  # the bound before the template runs; again after
    return request


def _check_text(messages) -> None:
    """JSON can carry a lone UTF-16 surrogate that is no Unicode text: refuse it before the template sees it."""
    problem = text_problem(messages, "messages")
    if problem:
        raise ApiError(400, problem, "messages", "invalid_text")
