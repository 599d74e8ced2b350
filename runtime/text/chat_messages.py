"""Checking a conversation and its tool definitions before a chat template sees them.

Messages come in OpenAI's shape and leave as the copies transformers' templates read:
- {"role": "system" | "developer" | "user" | "assistant", "content": str | [text parts], "name"?};
- an assistant message may carry `tool_calls`: [{"id", "type": "function", "function": {"name", "arguments"}}],
  where `arguments` is JSON text (OpenAI) or a dict (transformers' examples); the copy holds it as a dict, since
  templates write `tool_call.arguments | tojson`. Its content may then be null;
- {"role": "tool", "tool_call_id", "content"} answers one call of the nearest assistant message before it.
Tools are OpenAI's function definitions, {"type": "function", "function": {"name", "description"?,
"parameters"?, "strict"?}}, passed to the template as given once checked; the Responses API's flat shape
({"type": "function", "name", ...}) is read as the same.

Every refusal is a ChatError whose `param` names the field at fault ("messages[3].tool_call_id", "tools[0]").
"""

import json
import re

from ..errors import ChatError

ROLES = ("system", "user", "assistant", "tool")  # "developer" (OpenAI's newer name for system) is read as "system"
TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for a function name
MAX_TOOLS = 128  # OpenAI's limit on tools per request
FUNCTION_KEYS = ("name", "description", "parameters", "strict")


def check_messages(messages, keep_parts: bool = False) -> list:
    """Validated copies of the messages. Content given as OpenAI's text parts stays a list for templates that loop
    over parts, and is otherwise joined with newlines."""
    if not isinstance(messages, (list, tuple)):
        raise ChatError(f"messages must be a list of messages, got {type(messages).__name__}", "messages")
    if not messages:
        raise ChatError("messages is empty; give at least one message", "messages")
    checked, open_calls = [], None  # ids of the calls just made and not yet answered; None after other messages
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise ChatError(f"{where} must be an object with role and content, got {type(message).__name__}", where)
        role = message.get("role")
        role = "system" if role == "developer" else role
        if role not in ROLES:
            raise ChatError(f"{where}.role must be one of {', '.join(ROLES)}, got {role!r}", f"{where}.role")
        calls = message.get("tool_calls") if role == "assistant" else None
        calls = None if calls == [] else calls  # some clients send an empty list beside a plain answer
        if calls is not None:
            copy = {"role": role, "content": _optional_content(message.get("content"), f"{where}.content", keep_parts)}
            copy["tool_calls"] = _tool_calls(calls, f"{where}.tool_calls")
        else:
            copy = {"role": role, "content": _content(message.get("content"), f"{where}.content", keep_parts)}
        if role == "tool":  # results follow their calls directly, as OpenAI requires
            copy["tool_call_id"] = _answered(message.get("tool_call_id"), open_calls, where)
        else:
            open_calls = {call["id"] for call in copy["tool_calls"]} if calls is not None else None
        if message.get("name") is not None:
            if not isinstance(message["name"], str):
                raise ChatError(f"{where}.name must be a string", f"{where}.name")
            copy["name"] = message["name"]
        checked.append(copy)
    return checked


def check_tools(tools) -> list | None:
    """Validated copies of OpenAI function tools, in the order given; None stays None (no tools)."""
    if tools is None:
        return None
    if not isinstance(tools, (list, tuple)):
        raise ChatError(f"tools must be a list of function tools, got {type(tools).__name__}", "tools")
    if len(tools) > MAX_TOOLS:
        raise ChatError(f"tools lists {len(tools)} functions; at most {MAX_TOOLS} are allowed", "tools")
    checked, names = [], set()
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if isinstance(tool, dict) and tool.get("type") == "function" and "function" not in tool and "name" in tool:
            # the Responses API's flat shape, {"type": "function", "name", "parameters", ...}: nested as chat's
            tool = {"type": "function", "function": {k: v for k, v in tool.items() if k != "type"}}
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
            raise ChatError(
                f'{where} must be {{"type": "function", "function": {{"name": ..., "parameters": {{...}}}}}}', where
            )
        function = tool["function"]
        unknown = sorted(set(function) - set(FUNCTION_KEYS))
        if unknown or set(tool) - {"type", "function"}:
            extra = unknown[0] if unknown else sorted(set(tool) - {"type", "function"})[0]
            raise ChatError(f"{where} has an unknown field {extra!r}; a function has {', '.join(FUNCTION_KEYS)}", where)
        name = function.get("name")
        if not isinstance(name, str) or not TOOL_NAME.fullmatch(name):
            raise ChatError(
                f"{where}.function.name must be 1 to 64 letters, digits, '_' or '-', got {name!r}",
                f"{where}.function.name",
            )
        if name in names:
            raise ChatError(f"{where}.function.name {name!r} is given twice; tool names must differ", where)
        names.add(name)
        if function.get("description") is not None and not isinstance(function["description"], str):
            raise ChatError(f"{where}.function.description must be a string", f"{where}.function.description")
        if function.get("strict") is not None and not isinstance(function["strict"], bool):
            raise ChatError(f"{where}.function.strict must be true or false", f"{where}.function.strict")
        if "parameters" in function:
            _object_schema(function["parameters"], f"{where}.function.parameters")
        try:  # a copy the caller cannot change under us; refuses NaN, cycles and non-JSON values
            checked.append(json.loads(json.dumps(tool, allow_nan=False)))
        except (TypeError, ValueError, RecursionError) as error:
            raise ChatError(f"{where} is not JSON data: {_one_line(error)}", where) from None
    return checked


def tool_names(tools: list | None) -> list:
    """The function names of checked tools."""
    return [tool["function"]["name"] for tool in tools or ()]


def parameters_schema(tool: dict) -> dict:
    """A checked tool's parameter schema; a function without one takes no arguments, so `{}` is its only input."""
    return tool["function"].get("parameters", {"type": "object", "properties": {}, "additionalProperties": False})


def _object_schema(schema, where: str) -> None:
    if not isinstance(schema, dict) or schema.get("type") != "object":
        raise ChatError(
            f'{where} must be a JSON schema of an object, {{"type": "object", "properties": {{...}}}}', where
        )
    if "properties" in schema and not isinstance(schema["properties"], dict):
        raise ChatError(f"{where}.properties must be an object mapping names to schemas", f"{where}.properties")
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise ChatError(f"{where}.required must be a list of property names", f"{where}.required")


def _tool_calls(calls, where: str) -> list:
    if not isinstance(calls, list):
        raise ChatError(f"{where} must be a list of calls", where)
    copies, ids = [], set()
    for j, call in enumerate(calls):
        at = f"{where}[{j}]"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or call.get("type", "function") != "function":
            raise ChatError(f'{at} must be {{"id": ..., "type": "function", "function": {{"name", "arguments"}}}}', at)
        call_id = call.get("id")
        if not isinstance(call_id, str) or not call_id:
            raise ChatError(f"{at}.id must be a non-empty string; a tool message answers the call by it", f"{at}.id")
        if call_id in ids:
            raise ChatError(f"{at}.id {call_id!r} is given twice in one message", f"{at}.id")
        ids.add(call_id)
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise ChatError(f"{at}.function.name must be a non-empty string", f"{at}.function.name")
        arguments = function.get("arguments", "{}")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except (ValueError, RecursionError) as error:
                raise ChatError(
                    f"{at}.function.arguments is not JSON text: {_one_line(error)}", f"{at}.function.arguments"
                ) from None
        if not isinstance(arguments, dict):
            raise ChatError(
                f"{at}.function.arguments must be a JSON object, got {type(arguments).__name__}",
                f"{at}.function.arguments",
            )
        copies.append({"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}})
    return copies


def _answered(call_id, open_calls: set | None, where: str) -> str:
    """The id a tool message answers, which must be one of the latest assistant message's calls, answered once."""
    if open_calls is None:
        raise ChatError(
            f"{where} is a tool result, but the message before it is neither an assistant message with tool_calls "
            "nor another tool result",
            where,
        )
    if not isinstance(call_id, str):
        raise ChatError(f"{where}.tool_call_id must name the call this result answers", f"{where}.tool_call_id")
    if call_id not in open_calls:
        raise ChatError(
            f"{where}.tool_call_id {call_id[:80]!r} answers no open call of the assistant message before it",
            f"{where}.tool_call_id",
        )
    open_calls.discard(call_id)
    return call_id


def _optional_content(content, where: str, keep_parts: bool):
    """An assistant message with tool calls may have no text: null stays None, as OpenAI sends it."""
    return None if content is None else _content(content, where, keep_parts)


def _content(content, where: str, keep_parts: bool):
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ChatError(
                    f'{where}[{j}] must be a text part {{"type": "text", "text": "..."}}; edgelm reads text only',
                    f"{where}[{j}]",
                )
        parts = [{"type": "text", "text": part["text"]} for part in content]
        return parts if keep_parts else "\n".join(part["text"] for part in parts)
    raise ChatError(
        f'{where} must be a string or a list of text parts [{{"type": "text", "text": "..."}}], got {type(content).__name__}',
        where,
    )


def _one_line(error: Exception) -> str:
    text = " ".join(str(error).split()) or type(error).__name__
    return text[:300]
