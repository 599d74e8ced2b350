"""The constraint that makes a model call a tool: a Lark grammar, as llguidance reads it, for GenerationConfig's
`grammar` option.

For tool_choice "required" the answer is one call (or several, when parallel calls are allowed and the family
writes them) of any tool; for a named function, calls of that function only. Each call is the family's exact
wrapper and JSON keys around the arguments, and the arguments are llguidance's `%json{...}` of the tool's
parameter schema (laid out as ARGUMENTS_LAYOUT says, a bounded number with bounded digits as a json_schema's:
runtime/constraint_bounds.py), so they parse and validate. For example, Qwen2.5's format
with one tool `get_weather`:

    start: call ("\\n" call)*
    call: call_0
    call_0: "<tool_call>\\n{\\"name\\": \\"get_weather\\", \\"arguments\\": " args_0 "}\\n</tool_call>"
    args_0: %json {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"], "x-guidance": ...}

"auto" and "none" need no constraint (None): the answer is parsed afterwards. A schema llguidance cannot compile
fails where the grammar is compiled, with the GenerationOptionError that names it.
"""

import json

from ..errors import ChatError
from ..constraint_bounds import bounded_numbers
from .chat_messages import parameters_schema, tool_names

# The arguments are laid out as the templates write past calls (`tojson`, json.dumps' ", " and ": "), with no
# other whitespace: a model, and above all a random or weak one, cannot spend its tokens on blank space.
ARGUMENTS_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def chosen_names(tools: list | None, choice) -> list | None:
    """The functions `choice` (OpenAI's tool_choice) forces a call of, or None when it forces none."""
    if choice is None or choice in ("none", "auto"):
        return None
    names = tool_names(tools)
    if choice == "required":
        if not names:
            raise ChatError('tool_choice "required" needs at least one function in tools', "tool_choice")
        return names
    if isinstance(choice, dict) and choice.get("type") == "function":
        # chat completions: {"type": "function", "function": {"name"}}; responses: {"type": "function", "name"}
        name = choice["function"].get("name") if isinstance(choice.get("function"), dict) else choice.get("name")
        if not isinstance(name, str):
            raise ChatError(
                'tool_choice {"type": "function"} must name the function: "function": {"name": ...}', "tool_choice"
            )
        if name not in names:
            listed = ", ".join(names) if names else "none"
            raise ChatError(
                f"tool_choice names {name[:80]!r}, which is not among the tools given ({listed})", "tool_choice"
            )
        return [name]
    raise ChatError(
        'tool_choice must be "none", "auto", "required" or {"type": "function", "function": {"name": ...}}, '
        f"got {_short(choice)}",
        "tool_choice",
    )


def constraint(fmt, tools: list | None, choice, parallel: bool = True):
    """("grammar", Lark text) for `fmt` (a ToolFormat) or None; see the module's docstring."""
    names = chosen_names(tools, choice)
    if names is None:
        return None
    by_name = {tool["function"]["name"]: tool for tool in tools}
    lines, calls = [], []
    for i, name in enumerate(names):
        prefix, suffix = _wrapper(fmt, name)
        calls.append(f"call_{i}")
        lines.append(f"call_{i}: {_literal(prefix)} args_{i} {_literal(suffix)}")
        schema = bounded_numbers({**parameters_schema(by_name[name]), "x-guidance": ARGUMENTS_LAYOUT})
        lines.append(f"args_{i}: %json {json.dumps(schema, ensure_ascii=False)}")
    several = parallel and fmt.parallel
    if getattr(fmt, "listed", False):
        start = f"start: {_literal(fmt.begin)} call ({_literal(fmt.between)} call)* {_literal(fmt.end)}"
        if not several:
            start = f"start: {_literal(fmt.begin)} call {_literal(fmt.end)}"
    else:
        between = _literal(getattr(fmt, "between", ""))
        start = (
            f"start: call ({between} call)*"
            if several and between != '""'
            else "start: call+"
            if several
            else "start: call"
        )
    return "grammar", "\n".join([start, "call: " + " | ".join(calls), *lines]) + "\n"


def _wrapper(fmt, name: str) -> tuple:
    """(text before the arguments, text after them) of one call of `name`, as the format writes it."""
    marker = "\u2063arguments\u2063"  # a string no call text holds, written where the arguments go
    # a listed format's call is one item of its list; the others' is the whole wrapped call
    text = fmt.call_json(name, marker) if getattr(fmt, "listed", False) else fmt.call_text([(name, marker)])
    prefix, _, suffix = text.partition(json.dumps(marker, ensure_ascii=False))
    return prefix, suffix


def _literal(text: str) -> str:
    """A Lark string literal: JSON's escapes are Lark's."""
    return json.dumps(text, ensure_ascii=False)


def _short(value) -> str:
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = type(value).__name__
    return text[:80]
