"""POST /v1/responses, stateless: OpenAI's Responses API read into a chat request, run on the chat path.

    input                 a string (one user message) or a list of items: messages ({"role", "content"}: a string
                          or input_text / output_text parts), function_call items (the assistant's calls) and
                          function_call_output items (their results); reasoning items are skipped
    instructions          a system message before the input
    text.format           text, json_object or json_schema ({"type", "name", "schema", "strict"}) -> structured.py
    tools, tool_choice    function tools ({"type": "function", "name", "parameters", ...}) -> tool_calls.py
    max_output_tokens     max_new_tokens (without it, what the context leaves, up to --max-tokens-limit)
    temperature, top_p    as on chat; top_logprobs: each output_text carries its tokens' log-probs
    truncation "auto"     the oldest prompt tokens dropped when the input does not fit (truncate=True)

No state is kept: `store` is accepted and ignored (nothing is stored; the answer says store: false), and
`previous_response_id` and `conversation` are refused, so a client sends the whole conversation each time.
The answer's shapes and stream events: responses_answers.py.
"""

import secrets
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from ..api_errors import ApiError
from ..request_path import Ready, Result, StreamWriter
from .chat import Chat
from .chat_requests import ChatRequest
from .fields import RESPONSES_REFUSED, ResponsesExtras, refuse
from .requests import SamplingBody, check_max_tokens, check_tokens_held, given_fields, sampling_request
from .schema import STRICT, Text, json_type, validate
from .structured import response_format_options
from .tool_calls import answer_format, tool_use

ROLES = ("user", "assistant", "system", "developer")
TEXT_PARTS = ("input_text", "output_text", "text")


class TextBody(BaseModel):
    model_config = STRICT
    format: Any = None  # structured.py checks it
    verbosity: Any = None  # a length hint for OpenAI's reasoning models: ignored


class ResponsesBody(ResponsesExtras):
    """POST /v1/responses."""

    model: Text | None = None
    input: Any = None  # items checked by input_messages, which names the bad one
    instructions: Text | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_logprobs: int | None = None
    stream: bool | None = None
    text: TextBody | None = None
    tools: Any = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    truncation: Any = None


@dataclass(kw_only=True)
class ResponsesRequest(ChatRequest):
    """A /v1/responses body as a chat request, with what its answer echoes back."""

    body: dict = field(default_factory=dict)  # the fields a Response repeats (instructions, tools, text, ...)
    id: str = field(default_factory=lambda: "resp_" + secrets.token_hex(12))

    def field_of(self, option: str | None) -> str | None:
        if option == "max_new_tokens":
            return "max_output_tokens"
        if option in ("json_schema", "json_object"):
            return "text.format"
        if option == "logprobs":
            return "top_logprobs"
        if option == "prompt" or (option or "").startswith("messages"):
            return "input"
        if option == "truncate":
            return "truncation"
        return super().field_of(option)


def parse_responses_request(body, names, vocab_size: int, limits) -> ResponsesRequest:
    """Check a /v1/responses body and read it into a chat request; ApiError naming the bad field."""
    parsed = validate(ResponsesBody, body)
    given = given_fields(parsed)
    names.check(parsed.model)
    refuse(parsed, RESPONSES_REFUSED)
    if parsed.input is None:
        raise ApiError(
            400, 'input is required: a string, or a list of items like {"role": "user", "content": "Hi"}', "input"
        )
    if parsed.truncation not in (None, "auto", "disabled"):
        raise ApiError(
            400, f'truncation must be "auto" or "disabled", got {json_type(parsed.truncation)}', "truncation"
        )
    check_max_tokens(parsed.max_output_tokens, "max_output_tokens", limits)
    text_format = parsed.text.format if parsed.text is not None else None
    shared_body = SamplingBody(
        **{k: getattr(parsed, k) for k in ("temperature", "top_p", "stream") if k in given},
        truncate=True if parsed.truncation == "auto" else None,
    )
    shared = sampling_request(shared_body, given_fields(shared_body), vocab_size, limits)
    shared["options"].update(response_format_options(text_format, "text.format"))
    tools = tool_use(parsed.tools, parsed.tool_choice, parsed.parallel_tool_calls, function_of=_chat_tool)
    shared["answer_format"] = answer_format(tools, shared["options"], "text.format")
    max_tokens = parsed.max_output_tokens
    shared["options"]["max_new_tokens"] = max_tokens or 1
    if parsed.top_logprobs is not None:
        shared["options"]["logprobs"] = parsed.top_logprobs
    echoed = {
        "instructions": parsed.instructions,
        "max_output_tokens": max_tokens,
        "metadata": parsed.metadata if isinstance(parsed.metadata, dict) else {},
        "parallel_tool_calls": tools.parallel,
        "temperature": 1.0 if parsed.temperature is None else parsed.temperature,
        "top_p": 1.0 if parsed.top_p is None else parsed.top_p,
        "text": {"format": text_format if isinstance(text_format, dict) else {"type": "text"}},
        "tool_choice": parsed.tool_choice if parsed.tool_choice is not None else ("auto" if parsed.tools else "none"),
        "tools": parsed.tools or [],
        "truncation": parsed.truncation or "disabled",
        "top_logprobs": parsed.top_logprobs,
        "user": parsed.user if isinstance(parsed.user, str) else None,
    }
    request = ResponsesRequest(
        messages=input_messages(parsed.instructions, parsed.input),
        max_tokens=max_tokens,
        default_max_tokens=limits.max_tokens,
        logprobs=parsed.top_logprobs is not None,
        tools=tools,
        body=echoed,
        **shared,
    )
    check_tokens_held(request, [1], limits)
    return request


def input_messages(instructions: str | None, items) -> list:
    """The chat messages of `instructions` and `input`: consecutive function_call items become one assistant
    message with tool_calls, each function_call_output a tool message."""
    messages = [{"role": "system", "content": instructions}] if instructions else []
    if isinstance(items, str):
        return messages + [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise ApiError(400, f"input must be a string or a non-empty list of items, got {json_type(items)}", "input")
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise ApiError(400, f"{where} must be an object, got {json_type(item)}", where)
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ROLES:
                raise ApiError(400, f"{where}.role must be one of {', '.join(ROLES)}, got {role!r}", f"{where}.role")
            messages.append({"role": role, "content": _text(item.get("content"), f"{where}.content")})
        elif kind == "function_call":
            call = {
                "id": _string(item, "call_id", where),
                "type": "function",
                "function": {"name": _string(item, "name", where), "arguments": _string(item, "arguments", where)},
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":  # the calls of the answer just given
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            content = output if isinstance(output, str) else _text(output, f"{where}.output")
            messages.append({"role": "tool", "tool_call_id": _string(item, "call_id", where), "content": content})
        elif kind != "reasoning":  # a reasoning model's summary: nothing for these models to read
            raise ApiError(
                400,
                f"{where}.type is {kind!r}; edgelm reads message, function_call and function_call_output items",
                f"{where}.type",
            )
    return messages


def _text(content, where: str) -> str:
    """A message's content as text: a string, or text parts joined; image, audio and file parts are refused."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ApiError(400, f"{where} must be a string or a list of input_text parts, got {json_type(content)}", where)
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in TEXT_PARTS or not isinstance(part.get("text"), str):
            raise ApiError(
                400,
                f"{where}[{j}] is {kind or json_type(part)!r}: edgelm reads text only "
                '({"type": "input_text", "text": "..."})',
                f"{where}[{j}]",
            )
        texts.append(part["text"])
    return "\n".join(texts)


def _string(item: dict, key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise ApiError(400, f"{where}.{key} must be a string", f"{where}.{key}")
    return value


def _chat_tool(tool) -> dict:
    """A Responses API function tool ({"type", "name", "parameters", ...}) in chat's shape, which the text layer
    reads: {"type": "function", "function": {"name", "parameters", ...}}."""
    if not isinstance(tool, dict) or "function" in tool:
        return tool
    return {"type": "function", "function": {k: v for k, v in tool.items() if k != "type"}}


class Responses(Chat):
    """The chat endpoint with the Responses API's request and answer shapes."""

    def parse(self, body) -> ResponsesRequest:
        serving = self.serving
        return parse_responses_request(body, serving.names, self.model.arch.vocab_size, serving.limits)

    def answer(self, req: ResponsesRequest, result: Result):
        from .responses_answers import response

        return response(req, self.serving.model_id, result)

    def writer(self, req: ResponsesRequest, ready: Ready) -> StreamWriter:
        from .responses_answers import ResponsesStream

        return ResponsesStream(req, self.serving.model_id)
