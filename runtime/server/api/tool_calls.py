"""Tools on the chat and responses endpoints: OpenAI's `tools`, `tool_choice` and `parallel_tool_calls` read, and
the model's answer read back into calls, whole or as it streams.

The text layer (runtime/text/tools.py) owns each model family's tool format: how the chat template renders the
tools, the calls and their results, how a call is written in the answer (parse, stream) and the grammar that
forces one. Here is what the request asks of it:

    tool_choice "none"      the tools are not rendered; the answer is plain content
    "auto" (with tools)     the tools rendered; calls the answer makes are read from it afterwards
    "required", a function  the tools rendered, and the answer constrained (GenerationConfig's `grammar`) to the
                            family's call wrapper around arguments valid under the tool's parameter schema
    allowed_tools           the same, over the tools it lists
    "auto" and a format     response_format (or text.format) as well: the answer is constrained to either calls or
                            JSON of the format (a grammar of both), as an agent that wants a typed final answer
                            and may call tools first asks for it
    a forced call, a format the call is forced; the format holds the later answer that is not a call
    parallel_tool_calls     false: at most one call per answer (the grammar allows one; auto keeps the first)

The definitions and the messages (a tool message must answer a call of the assistant message before it) are
checked by the text layer, whose ChatError names the field; an answer with calls ends with finish_reason
"tool_calls", unless max_tokens cut it: then "length", with the calls it completed, and the call it was cut inside
dropped (neither a call nor content; docs/tools.md).
"""

import importlib.util
import json
import re
from contextlib import contextmanager
from dataclasses import dataclass

from ...errors import GenerationOptionError
from ...generation_config import GenerationConfig
from ...sampling.constraint import MAX_TEXT
from ...sampling.constraint import check as check_constraint
from ...constraint_bounds import bounded_numbers
from ..api_errors import ApiError
from .schema import json_type

CHOICES = ("none", "auto", "required")


@dataclass
class ToolUse:
    """The tools of one request: `tools` as rendered (None: none), `choice` as the text layer takes it ("none",
    "auto", "required" or {"type": "function", "function": {"name"}}), and whether calls may come several at once."""

    tools: list | None = None
    choice: object = "none"
    parallel: bool = True

    @property
    def active(self) -> bool:
        """Whether the tools are rendered and the answer is read for calls."""
        return bool(self.tools) and self.choice != "none"

    @property
    def forced(self) -> bool:
        """Whether the answer must be a call (tool_choice "required" or a named function)."""
        return self.active and self.choice != "auto"

    def check_schemas(self) -> None:
        """Each tool's parameter schema compiled as a forced call would compile it, so that a schema edgelm cannot
        enforce is a 400 naming the tool even under "auto". Where llguidance is not installed (no forced calls
        either) the text layer's shape checks are all there is."""
        if not self.active or importlib.util.find_spec("llguidance") is None:
            return
        for i, tool in enumerate(self.tools):
            function = tool.get("function") if isinstance(tool, dict) else None
            schema = function.get("parameters") if isinstance(function, dict) else None
            if not isinstance(schema, dict):
                continue  # absent, or the wrong shape: the text layer names it
            try:
                check_constraint(GenerationConfig(json_schema=schema))
            except GenerationOptionError as error:
                where = f"tools[{i}].function.parameters"
                raise ApiError(400, f"{where}: {str(error).replace('json_schema', 'the schema', 1)}", where) from None

    def constraint(self, fmt, answer: dict | None = None) -> dict:
        """The runtime options forcing a call (required, a named function: the `answer` format waits for an answer
        that is no call), or under "auto" with an `answer` format ({"json_schema": ...} or {"json_object": True})
        a call or that JSON; else none."""
        if not self.active:
            return {}
        if self.choice == "auto":
            if not answer:
                return {}
            _, calls = fmt.constraint(self.tools, "required", self.parallel)
            text = calls_or_json(calls, answer)
            self._check_size(text)
            return {"grammar": text}
        found = fmt.constraint(self.tools, self.choice, self.parallel)
        if found is None:
            return {}
        kind, text = found
        self._check_size(text)
        return {kind: text}

    def _check_size(self, grammar: str) -> None:
        """The grammar forcing a call is bounded as a grammar the client sent would be, and said of `tools`."""
        if len(grammar) > MAX_TEXT:
            raise ApiError(
                400,
                f"tools: forcing a call of these {len(self.tools)} tools takes a grammar of {len(grammar):,} "
                f"characters, over the {MAX_TEXT:,} edgelm compiles; offer fewer tools or smaller parameter schemas, "
                'or use tool_choice "auto"',
                "tools",
            )

    def read(self, fmt, text: str, cut: bool = False) -> tuple:
        """(content or None, [ToolCall]) of a whole answer; `cut` (finish_reason "length"): a call the answer ends
        inside is dropped."""
        if not self.active:
            return text, []
        content, calls = fmt.parse(text, cut)
        return content, calls if self.parallel else calls[:1]


@contextmanager
def named_as_tools(tools: ToolUse, field_of):
    """Within it, a GenerationOptionError of the grammar edgelm built from `tools` (the client sent no grammar) is a
    400 that names `tools`, and max_new_tokens the request's own field (`field_of(option)`)."""
    try:
        yield
    except GenerationOptionError as error:
        if error.param not in ("grammar", "max_new_tokens") or not tools.active or tools.choice == "none":
            raise
        message = str(error)
        if message.startswith("the grammar constraint"):
            message = "a forced call of these tools" + message[len("the grammar constraint") :]
        elif message.startswith("grammar"):
            message = "the grammar forcing a call of these tools" + message[len("grammar") :]
        else:
            raise
        if error.param == "max_new_tokens":
            field = field_of("max_new_tokens")
            raise ApiError(400, message.replace("max_new_tokens", field), field) from None
        raise ApiError(400, f"tools: {message}; offer fewer tools or smaller parameter schemas", "tools") from None


def calls_or_json(calls: str, answer: dict) -> str:
    """A Lark grammar (llguidance's) of either the calls `calls` (the format's grammar for tool_choice "required")
    or JSON of the `answer` format, compact as response_format's JSON is without tools."""
    schema = answer.get("json_schema") or {"type": "object"}
    schema = json.loads(schema) if isinstance(schema, str) else dict(schema)
    schema["x-guidance"] = {"whitespace_flexible": False, **schema.get("x-guidance", {})}
    schema = bounded_numbers(schema)  # as a json_schema's (runtime/constraint_bounds.py)
    renamed = re.sub(r"(?m)^start:", "tool_calls:", calls)
    return f"start: tool_calls | json_answer\njson_answer: %json {json.dumps(schema)}\n{renamed}"


def answer_format(tools: ToolUse, options: dict, field: str) -> dict:
    """The JSON format a request's options ask for, taken out of `options` where tools are in use (under "auto" it
    joins the tools' grammar), else left there ({} returned). With a call forced as well (an agent's typed final
    answer and tool_choice "required"), the call is forced, as OpenAI does it: this answer is a call, and the format
    holds the later answer that is not one (the request that sends the results back under "auto")."""
    asked = {k: options[k] for k in ("json_schema", "json_object") if k in options}
    if not asked or not tools.active:
        return {}
    for key in asked:
        del options[key]
    return asked


def tool_use(tools, tool_choice, parallel_tool_calls, function_of=None) -> ToolUse:
    """The request's ToolUse; ApiError for a tool_choice of the wrong shape. `function_of` turns the Responses
    API's flat shapes ({"type": "function", "name": ...}) into chat's."""
    if tools is not None and not isinstance(tools, list):
        raise ApiError(400, f"tools must be a list of function tools, got {json_type(tools)}", "tools")
    for i, tool in enumerate(tools or []):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind not in ("function", None):
            raise ApiError(
                400, f"tools[{i}].type is {kind!r}: edgelm calls functions only (type \"function\")", f"tools[{i}].type"
            )
    if function_of is not None and tools:
        tools = [function_of(tool) for tool in tools]
    if parallel_tool_calls is not None and not isinstance(parallel_tool_calls, bool):
        raise ApiError(400, "parallel_tool_calls must be true or false", "parallel_tool_calls")
    choice = ("auto" if tools else "none") if tool_choice is None else tool_choice
    if isinstance(choice, dict) and choice.get("type") == "allowed_tools":
        tools, choice = _allowed(tools, choice)
    elif isinstance(choice, dict) and choice.get("type") == "function" and "function" not in choice:
        choice = {"type": "function", "function": {"name": choice.get("name")}}  # the Responses API's shape
    elif not (choice in CHOICES or (isinstance(choice, dict) and choice.get("type") == "function")):
        raise ApiError(
            400,
            'tool_choice must be "none", "auto", "required" or {"type": "function", "function": {"name": ...}}, '
            f"got {json_type(choice)}",
            "tool_choice",
        )
    if choice != "none" and choice != "auto" and not tools:
        raise ApiError(400, "tool_choice asks for a tool call, but no tools are given", "tool_choice")
    return ToolUse(tools or None, choice, parallel_tool_calls is not False)


def _allowed(tools, choice: dict) -> tuple:
    """OpenAI's allowed_tools: the tools it names (of those given) and its mode, "auto" or "required"."""
    spec = choice.get("allowed_tools", choice)  # chat nests it; the Responses API does not
    mode, listed = spec.get("mode"), spec.get("tools")
    if mode not in ("auto", "required") or not isinstance(listed, list):
        raise ApiError(
            400, 'tool_choice.allowed_tools needs "mode" ("auto" or "required") and "tools" (a list)', "tool_choice"
        )
    names = set()
    for entry in listed:
        function = entry.get("function", entry) if isinstance(entry, dict) else {}
        names.add(function.get("name") if isinstance(function, dict) else None)
    given = {tool.get("function", {}).get("name") for tool in tools or [] if isinstance(tool, dict)}
    unknown = sorted(str(n) for n in names - given)
    if unknown:
        raise ApiError(
            400, f"tool_choice.allowed_tools names {unknown[0][:80]!r}, which is not among the tools", "tool_choice"
        )
    return [t for t in tools if t.get("function", {}).get("name") in names], mode


def finish_reason(completion_reason: str, calls: int) -> str:
    """An answer's finish_reason: "length" where max_tokens cut it (calls or not), else "tool_calls" with calls."""
    if completion_reason == "length":
        return "length"
    return "tool_calls" if calls else completion_reason
