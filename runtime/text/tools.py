"""Tool calls in a model's own words: one ToolFormat per family, found from the package's chat template.

    fmt = tool_format(model)                          # a Model, a ChatTemplate or a template's text
    content, calls = fmt.parse(text)                  # calls: [ToolCall(id, name, arguments_json)]
    stream = fmt.stream(); stream.feed(piece) ...     # ContentDelta / ToolCallDelta, then stream.finish()
    fmt.constraint(tools, "required")                 # ("grammar", Lark text) for GenerationConfig, or None

The families (docs/tools.md shows each):
- "hermes", Qwen2.5's (and any template that writes `<tool_call>`): one block per call,
  `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, several allowed, text around them;
- "llama3", Llama 3.1 / 3.2's JSON tool calling: the whole answer is `{"name": ..., "parameters": {...}}`,
  optionally after `<|python_tag|>`; one call per answer, as their template renders only one;
- "smollm2", SmolLM2-Instruct's: one block holding a list, `<tool_call>[{"name": ..., "arguments": {...}}]
  </tool_call>`, as its model card's function-calling prompt asks (its template itself ignores tools);
- "edgelm", the default template's for GPT-2 packages and any other template: `<tool_call>{"name": ...,
  "arguments": {...}}</tool_call>` per call, on the answer's one line.
Parsing never raises: text that is not a well-formed call stays content.
"""

import json

from .chat_messages import check_tools
from .tool_stream import ContentDelta, JsonAnswerStream, TaggedStream, ToolCall, ToolCallDelta, ToolStream

__all__ = ["ContentDelta", "ToolCall", "ToolCallDelta", "ToolFormat", "ToolStream", "tool_format"]

PYTHON_TAG = "<|python_tag|>"
LLAMA_ENDS = ("<|eom_id|>", "<|eot_id|>")  # end-of-message tokens a package may not list as stop ids
# the default chat template's tool prompt (text/chat_template.py DEFAULT_TEMPLATE writes it): this format's own
TOOLS_LINE = (
    "Tools: to call functions, answer with <tool_call>{\"name\": NAME, \"arguments\": {...}}</tool_call> "
    "for each call. The functions, as JSON:"
)
HERMES_PROMPT = (  # Qwen2.5's own words, as its template writes them after the system message
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>{tools}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within <tool_call></tool_call> "
    'XML tags:\n<tool_call>\n{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)
LLAMA3_PROMPT = (  # Llama 3.1 / 3.2's template's words for tools in the system message
    "You have access to the following functions. To call a function, please respond with JSON for a function call."
    'Respond in the format {{"name": function name, "parameters": dictionary of argument name and its value}}.'
    "Do not use variables.\n\n{tools}"
)
SMOLLM2_PROMPT = (  # SmolLM2-Instruct's model card's function-calling system prompt
    "You are an expert in composing functions. You are given a question and a set of possible functions.\n"
    "Based on the question, you will need to make one or more function/tool calls to achieve the purpose.\n"
    "If none of the functions can be used, point it out and refuse to answer.\n"
    "If the given question lacks the parameters required by the function, also point it out.\n\n"
    "You have access to the following tools:\n<tools>{tools}</tools>\n\n"
    "The output MUST strictly adhere to the following format, and NO other text MUST be included.\n"
    "The example format is as follows. Please make sure the parameter type is correct. If no function call is "
    "needed, please make the tool calls an empty list '[]'.\n"
    '<tool_call>[\n{{"name": "func_name1", "arguments": {{"argument1": "value1", "argument2": "value2"}}}},\n'
    "... (more tool calls as required)\n]</tool_call>"
)


class ToolFormat:
    """How one family writes calls: parse and stream them, constrain an answer to them, and write tools, calls
    and results into plain messages for a template that does not render them (SmolLM2's)."""

    name = ""
    arguments_key = "arguments"  # the key holding a call's arguments in the model's JSON
    parallel = True  # whether one answer may hold several calls
    result_role = "user"  # the role a tool result is written as by inline()
    merge_results = True  # whether inline() writes a run of results as one message, as Qwen2.5's template does

    def parse(self, text: str, cut: bool = False) -> tuple:
        """(content or None, [ToolCall]) for a whole answer; never raises. `cut`: the answer was cut short
        (finish_reason "length"): a call it ends inside is dropped, neither a call nor content."""
        stream = self.stream()
        stream.feed(text if isinstance(text, str) else "")
        stream.finish(cut)
        return stream.result()

    def stream(self) -> ToolStream:
        raise NotImplementedError

    def call_text(self, calls: list) -> str:
        """The answer text of `calls` ([(name, arguments dict)]), exactly as constraint() forces it."""
        raise NotImplementedError

    def constraint(self, tools, choice="auto", parallel: bool = True):
        """("grammar", Lark text) forcing a call for tool_choice "required" (any of `tools`) or a named function
        ({"type": "function", "function": {"name": ...}}), its arguments matching the tool's parameter schema;
        None for "auto" and "none" (parse the answer afterwards). `parallel` allows several calls in one answer."""
        from .tool_grammar import constraint

        return constraint(self, check_tools(tools), choice, parallel)

    def tools_prompt(self, tools: list) -> str:
        raise NotImplementedError

    def result_text(self, content: str) -> str:
        return f"<tool_response>\n{content}\n</tool_response>"

    def inline(self, messages: list, tools: list | None) -> list:
        """Checked messages with the tools in the system message, each call as the answer text the model writes,
        and each run of results as one `result_role` message: what the family's model was trained on."""
        out = []
        if tools:
            prompt = self.tools_prompt(tools)
            if messages[0]["role"] == "system":
                system = _text(messages[0]["content"])
                out.append({"role": "system", "content": f"{system}\n\n{prompt}" if system else prompt})
                messages = messages[1:]
            else:
                out.append({"role": "system", "content": prompt})
        merging = False  # whether the last message written holds results that later ones join
        for message in messages:
            if message["role"] == "tool":
                text = self.result_text(_text(message["content"]))
                if merging and self.merge_results:
                    out[-1] = {**out[-1], "content": out[-1]["content"] + "\n" + text}
                else:
                    out.append({"role": self.result_role, "content": text})
                merging = True
                continue
            merging = False
            if message.get("tool_calls"):
                calls = self.call_text(
                    [(c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"]]
                )
                content = _text(message["content"] or "")
                out.append({"role": "assistant", "content": f"{content}\n{calls}" if content else calls})
            else:
                out.append(message)
        return out


class TaggedFormat(ToolFormat):
    """Calls in `<tool_call>` blocks: `begin` + call JSON + `end`, calls joined by `between` (in one block,
    as a JSON list, when `listed`)."""

    def __init__(self, name: str, begin: str, end: str, between: str, listed: bool = False, prompt: str = ""):
        self.name, self.prompt = name, prompt
        self.begin, self.end, self.between, self.listed = begin, end, between, listed

    def stream(self) -> ToolStream:
        return TaggedStream(self.parse_block)

    def parse_block(self, body: str):
        """[(name, arguments)] from the text between the tags, or None when it is no well-formed call."""
        value = _json(body)
        if self.listed and isinstance(value, list):
            calls = [_call(item, self.arguments_key) for item in value]
            return None if any(c is None for c in calls) else calls
        call = _call(value, self.arguments_key)
        return None if call is None else [call]

    def call_json(self, name: str, arguments: dict) -> str:
        return json.dumps({"name": name, self.arguments_key: arguments}, ensure_ascii=False)

    def call_text(self, calls: list) -> str:
        if self.listed:
            return self.begin + self.between.join(self.call_json(*c) for c in calls) + self.end
        return self.between.join(self.begin + self.call_json(*c) + self.end for c in calls)

    def tools_prompt(self, tools: list) -> str:
        if self.name == "edgelm":
            return TOOLS_LINE + "".join("\n" + json.dumps(t, ensure_ascii=False) for t in tools)
        if self.name == "smollm2":
            return self.prompt.format(tools=json.dumps(tools, ensure_ascii=False))
        return self.prompt.format(tools="".join("\n" + json.dumps(t, ensure_ascii=False) for t in tools))


class Llama3Format(ToolFormat):
    """Llama 3.x: the answer is the call's JSON, `{"name": ..., "parameters": {...}}`, after an optional
    `<|python_tag|>`; results go back as `ipython` messages."""

    name = "llama3"
    arguments_key = "parameters"
    parallel = False
    result_role = "ipython"  # each result its own message, as Llama 3.1's template writes them
    merge_results = False

    def stream(self) -> ToolStream:
        return JsonAnswerStream(self.parse_answer, PYTHON_TAG)

    def parse_answer(self, text: str):
        text = text.strip()
        text = text[len(PYTHON_TAG) :].lstrip() if text.startswith(PYTHON_TAG) else text
        for end in LLAMA_ENDS:
            text = text[: -len(end)].rstrip() if text.endswith(end) else text
        calls, decoder, at = [], json.JSONDecoder(), 0
        while at < len(text):  # one object, or several joined by ";" as Llama 3.2 sometimes writes them
            try:
                value, at = decoder.raw_decode(text, at)
            except (ValueError, RecursionError):
                return None
            call = _call(value, self.arguments_key)
            if call is None:
                return None
            calls.append(call)
            while at < len(text) and (text[at].isspace() or text[at] == ";"):
                at += 1
        return calls or None

    def call_text(self, calls: list) -> str:
        return "; ".join(json.dumps({"name": n, "parameters": a}, ensure_ascii=False) for n, a in calls)

    def tools_prompt(self, tools: list) -> str:
        return LLAMA3_PROMPT.format(tools="".join(json.dumps(t, indent=4, ensure_ascii=False) + "\n\n" for t in tools))

    def result_text(self, content: str) -> str:
        return content


HERMES = TaggedFormat("hermes", "<tool_call>\n", "\n</tool_call>", "\n", prompt=HERMES_PROMPT)
LLAMA3 = Llama3Format()
SMOLLM2 = TaggedFormat("smollm2", "<tool_call>[\n", "\n]</tool_call>", ",\n", listed=True, prompt=SMOLLM2_PROMPT)
EDGELM = TaggedFormat("edgelm", "<tool_call>", "</tool_call>", "")
FORMATS = {f.name: f for f in (HERMES, LLAMA3, SMOLLM2, EDGELM)}


def tool_format(source) -> ToolFormat:
    """The tool format of a Model (its chat template), a ChatTemplate or a template's text. For a package that is
    not loaded, `tool_format(ChatTemplate.from_package(package))`."""
    template = getattr(source, "chat_template", source)  # a Model's
    if isinstance(template, str):
        return format_of(template)
    if isinstance(getattr(template, "tool_format", None), ToolFormat):  # a ChatTemplate
        return template.tool_format
    raise TypeError(
        f"tool_format takes a Model, a ChatTemplate or a chat template's text, not {type(source).__name__}; for a "
        "package, pass ChatTemplate.from_package(package)"
    )


def format_of(text, model_type: str | None = None) -> ToolFormat:
    """The format a chat template's text writes calls in (the package's model_type where the text says nothing)."""
    text = text if isinstance(text, str) else ""
    if TOOLS_LINE in text:  # the default template's; its line shows <tool_call> too, so it is told apart first
        return EDGELM
    if "<tool_call>" in text:
        return HERMES
    if "<|start_header_id|>" in text or PYTHON_TAG in text:
        return LLAMA3
    if "SmolLM" in text:
        return SMOLLM2
    return {"qwen2": HERMES}.get(model_type, EDGELM)


def _json(text: str):
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def _call(value, arguments_key: str):
    """(name, arguments dict) from a call's JSON, or None: a name, and arguments as an object, JSON text of one,
    or absent (no arguments)."""
    if not isinstance(value, dict) or not isinstance(value.get("name"), str) or not value["name"]:
        return None
    arguments = value.get(arguments_key, value.get("arguments", value.get("parameters", {})))
    if isinstance(arguments, str):
        arguments = _json(arguments)
    return (value["name"], arguments) if isinstance(arguments, dict) else None


def _text(content) -> str:
    """A message's content as one string (text parts joined with newlines)."""
    if isinstance(content, list):
        return "\n".join(part["text"] for part in content)
    return content
