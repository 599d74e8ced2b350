"""Chat templates: a conversation (a list of {"role", "content"} messages) and tools in, one prompt string out.

A package's template is the `chat_template` of its tokenizer_config.json, rendered the way transformers'
`apply_chat_template(messages, tools=tools)` renders it, so a prompt made here equals the one transformers makes:
- Jinja2 in an `ImmutableSandboxedEnvironment` with trim_blocks and lstrip_blocks, the loop controls
  (`break`, `continue`) and the `{% generation %}` tag (a pass-through here);
- globals `raise_exception(message)` and `strftime_now(format)`; a `tojson` filter that does not escape HTML;
- variables `messages` (checked by chat_messages.py: tool calls, tool results), `tools` (OpenAI function
  definitions, or None) and `documents` (None), `add_generation_prompt`, and the special tokens (`bos_token`,
  `eos_token`, ..., `additional_special_tokens`) as strings.
A template that never reads `tools` (SmolLM2's) would drop them, as transformers does; edgelm instead writes the
tools, calls and results into plain messages in the family's tool format (tools.py) and renders those.

A package without a template gets DEFAULT_TEMPLATE, plain lines a base model continues naturally:

    System: You are terse.
    User: Hello!
    Assistant:

with DEFAULT_STOP ending the answer where the model starts the next turn itself. With tools it writes
TOOLS_LINE and one JSON line per tool first, each call as `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
on the assistant's line, and a result as a `Tool: ...` line (docs/tools.md).

Messages come from callers and HTTP requests; the template comes from the package. The sandbox keeps a
template away from Python's internals, and a render is bounded in size, work and time (chat_bounds.py). Every refusal is a ChatError whose `param` names the field at fault ("messages[1].role").
"""

import json
from datetime import datetime
from pathlib import Path

from .. import untrusted
from ..errors import ChatError, DeadlineError
from .chat_bounds import MAX_PROMPT_CHARS, Budget, bounded_join, bounded_json
from .chat_messages import ROLES, check_messages, check_tools
from .chat_sandbox import bounded_environment
from .tools import TOOLS_LINE, format_of

__all__ = ["ROLES", "ChatTemplate", "DEFAULT_STOP", "DEFAULT_TEMPLATE", "check_messages", "check_tools"]

# The default template's tool prompt: one line, then one JSON line per tool. tools.py parses what it asks for.
DEFAULT_TEMPLATE = (
    "{% if tools %}" + TOOLS_LINE + "\n"  # braces alone are text to Jinja
    "{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}{% endif %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'tool' %}Tool: {{ message['content'] }}\n"
    "{% elif message['tool_calls'] %}Assistant: {% if message['content'] %}{{ message['content'] }} {% endif %}"
    "{% for call in message['tool_calls'] %}<tool_call>"
    "{{ {'name': call['function']['name'], 'arguments': call['function']['arguments']} | tojson }}"
    "</tool_call>{% endfor %}{{ '\n' }}"
    "{% else %}{{ message['role'] | capitalize }}: {{ message['content'] }}\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}"
)
DEFAULT_STOP = ("\nUser:", "\nSystem:", "\nTool:")  # the default template's turns begin on a new line
MAX_TEMPLATE_CHARS = 200_000  # real templates are 1-20 kB
MAX_CONFIG_BYTES = 16 << 20  # tokenizer_config.json with a large added_tokens_decoder
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
PROBE = "\u2063edgelm-end-of-turn\u2063"  # an assistant answer no template changes, to find what follows one


class ChatTemplate:
    """A compiled chat template with the special tokens it is rendered with. Safe to share between threads."""

    def __init__(
        self,
        source,
        special_tokens: dict | None = None,
        origin: str = "the chat template",
        model_type: str | None = None,
    ):
        self.source = source  # as found in the package: checked at first use, so a bad one fails chat, not load
        self.special_tokens = dict(special_tokens or {})
        self.origin = origin  # where the template came from, for error messages
        self.model_type = model_type  # the package's ("qwen2", ...): names the tool format where the text does not
        self.is_default = source is DEFAULT_TEMPLATE
        self._compiled = None  # (jinja Template, reads content parts, reads tools); built on first render
        self._stop = None

    @classmethod
    def default(cls, special_tokens: dict | None = None) -> "ChatTemplate":
        return cls(DEFAULT_TEMPLATE, special_tokens, "edgelm's default chat template")

    @property
    def tool_format(self):
        """The format this template writes tool calls in (runtime/text/tools.py ToolFormat)."""
        return format_of(self.source, self.model_type)

    @classmethod
    def from_package(cls, package) -> "ChatTemplate":
        """The package's template, or the default one. Never raises: a damaged file fails at chat time."""
        name = "tokenizer_config.json"
        listed = name in package.manifest.files if package.manifest else True
        path = package.folder / name
        if not listed or not path.is_file() or path.is_symlink():
            return cls.default() if _base_model(package) else cls(_Broken(NO_TEMPLATE.format(path=path)), origin=name)
        origin = f"the chat template in {path}"
        try:
            config = json.loads(untrusted.read_bytes(path, MAX_CONFIG_BYTES, ValueError).decode("utf-8"))
            if not isinstance(config, dict):
                raise ValueError("it does not hold a JSON object")
        except (OSError, ValueError, RecursionError) as error:
            return cls(_Broken(f"cannot read {path}: {error}"), origin=origin)
        if config.get("chat_template") is None:
            if not _base_model(package):  # an instruction-tuned family: the default's plain lines would mislead it
                return cls(_Broken(NO_TEMPLATE.format(path=path)), origin=origin)
            return cls.default(special_tokens_of(config, _special_tokens_map(package.folder, package.manifest)))
        source = config["chat_template"]
        if isinstance(source, list):  # named templates, as transformers saves several: it renders "default"
            named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
            source = named.get("default", _Broken(f"{path} lists named chat templates but none called 'default'"))
        tokens = special_tokens_of(config, _special_tokens_map(package.folder, package.manifest))
        return cls(source, tokens, origin, getattr(package.arch, "model_type", None))

    def render(self, messages, add_generation_prompt: bool = True, tools=None) -> str:
        """The prompt for `messages` (and OpenAI function `tools`, if any), ending with the assistant's turn opened
        when add_generation_prompt."""
        template, reads_parts, reads_tools = self._template()
        checked = check_messages(messages, keep_parts=reads_parts)
        tools = check_tools(tools)
        if not reads_tools and (tools or any(m.get("tool_calls") or m["role"] == "tool" for m in checked)):
            checked, tools = self.tool_format.inline(checked, tools), None
        variables = {
            **self.special_tokens,
            "messages": checked,
            "tools": tools,
            "documents": None,
            "add_generation_prompt": bool(add_generation_prompt),
        }
        out, size = [], 0
        try:
            with Budget():
                for piece in template.generate(**variables):
                    size += len(piece)
                    if size > MAX_PROMPT_CHARS:
                        raise ChatError(
                            f"the conversation renders to over {MAX_PROMPT_CHARS} characters; send fewer or shorter messages",
                            "messages",
                        )
                    out.append(piece)
        except (ChatError, DeadlineError):
            raise
        except Exception as error:  # Jinja errors, raise_exception(), sandbox refusals, Python errors inside
            raise ChatError(f"{self.origin} cannot render these messages: {_one_line(error)}", "messages") from None
        return "".join(out)

    @property
    def reads_tools(self) -> bool:
        """Whether the template renders `tools` itself; if not, render() writes them into the messages."""
        return self._template()[2]

    @property
    def stop(self) -> tuple:
        """Stop strings that end an answer: DEFAULT_STOP for the default template; for a package's, the text it
        puts right after an assistant message (ChatML's "<|im_end|>"), up to the first whitespace, if any."""
        if self._stop is None:
            if self.is_default:
                self._stop = DEFAULT_STOP
            else:
                try:
                    probe = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": PROBE}]
                    after = self.render(probe, add_generation_prompt=False).partition(PROBE)[2].split()
                except ChatError:
                    after = []
                self._stop = (after[0],) if after else ()
        return self._stop

    def _template(self):
        if self._compiled is None:
            if isinstance(self.source, _Broken):
                raise ChatError(f"{self.source}; set a template with: edgelm export --chat-template FILE")
            self._compiled = compile_template(self.source, self.origin)
        return self._compiled


def compile_template(source, origin: str = "the chat template"):
    """(jinja Template, whether it loops over a message's content parts, whether it reads `tools`); ChatError if
    it is no template."""
    if not isinstance(source, str):
        raise ChatError(
            f"{origin} is a {type(source).__name__}, not a string; set one with: edgelm export --chat-template FILE"
        )
    if len(source) > MAX_TEMPLATE_CHARS:
        raise ChatError(f"{origin} is {len(source)} characters, over the {MAX_TEMPLATE_CHARS} allowed")
    import jinja2
    from jinja2 import nodes

    environment = _environment()
    try:
        tree = environment.parse(source)
        template = environment.from_string(tree)
        template.root_render_func.__globals__["str_join"] = bounded_join  # `~`, which no sandbox hook sees
        reads_tools = any(n.name == "tools" and n.ctx == "load" for n in tree.find_all(nodes.Name))
        return template, _reads_parts(tree), reads_tools
    except jinja2.TemplateError as error:
        raise ChatError(f"{origin} is not a valid Jinja template: {_one_line(error)}") from None


def special_tokens_of(config: dict, special_tokens_map: dict | None = None) -> dict:
    """The special tokens transformers passes a template (its `special_tokens_map`), as strings, from
    tokenizer_config.json; a legacy config (no added_tokens_decoder) takes special_tokens_map.json's over it."""
    merged = dict(config)
    if "added_tokens_decoder" not in config:
        merged.update({k: v for k, v in (special_tokens_map or {}).items() if v})
    extra = merged.get("extra_special_tokens")
    names = SPECIAL_TOKENS + tuple(extra) if isinstance(extra, dict) else SPECIAL_TOKENS
    if isinstance(extra, dict):
        merged.update(extra)
    tokens = {}
    for name in names:
        value = _token_text(merged.get(name))
        if value:
            tokens[name] = value
    listed = merged.get("additional_special_tokens")
    if isinstance(listed, list) and listed:
        tokens["additional_special_tokens"] = [t for t in map(_token_text, listed) if t is not None]
    return tokens


def _token_text(value):
    """A special token as transformers' special_tokens_map shows it: a string, or an AddedToken's content."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _special_tokens_map(folder: Path, manifest: dict) -> dict:
    name = "special_tokens_map.json"
    path = folder / name
    if (manifest and name not in manifest.files) or not path.is_file() or path.is_symlink():
        return {}
    try:
        data = json.loads(untrusted.read_bytes(path, MAX_CONFIG_BYTES, ValueError).decode("utf-8"))
    except (OSError, ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


def _reads_parts(tree) -> bool:
    """Whether the template loops over a message's content (`for part in message['content']`, directly or
    through a variable set from it), as templates written for OpenAI-style content parts do."""
    from jinja2 import nodes

    def is_content(node):
        return (
            isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Const) and node.arg.value == "content"
        ) or (isinstance(node, nodes.Getattr) and node.attr == "content")

    aliases = {
        a.target.name for a in tree.find_all(nodes.Assign) if isinstance(a.target, nodes.Name) and is_content(a.node)
    }
    return any(
        is_content(loop.iter) or (isinstance(loop.iter, nodes.Name) and loop.iter.name in aliases)
        for loop in tree.find_all(nodes.For)
    )


def _environment():
    """The Jinja environment transformers renders chat templates in, bounded (chat_sandbox.py)."""
    from jinja2.exceptions import TemplateError
    from jinja2.ext import Extension, loopcontrols

    class Generation(Extension):
        """`{% generation %}...{% endgeneration %}` marks the assistant's tokens for training; it renders as its body."""

        tags = {"generation"}

        def parse(self, parser):
            next(parser.stream)
            return parser.parse_statements(("name:endgeneration",), drop_needle=True)

    def raise_exception(message):
        raise TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        # transformers' tojson: no HTML escaping (Jinja's own escapes < > & '), json.dumps' options exposed
        return bounded_json(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.now().strftime(format)

    environment = bounded_environment(extensions=[Generation, loopcontrols])
    environment.filters["tojson"] = tojson
    environment.globals["raise_exception"] = raise_exception
    environment.globals["strftime_now"] = strftime_now
    return environment


def _one_line(error: Exception) -> str:
    text = " ".join(str(error).split()) or type(error).__name__
    return text[:300]


NO_TEMPLATE = "{path} has no chat template (edgelm's default one suits GPT-2 base models only; generate needs none)"


def _base_model(package) -> bool:
    """GPT-2 packages (learned positions: base models) get DEFAULT_TEMPLATE when they carry none."""
    return package.arch.positions == "learned"


class _Broken:
    """A template that could not be read; the reason is raised when the template is first used."""

    def __init__(self, reason: str):
        self.reason = reason

    def __str__(self):
        return self.reason
