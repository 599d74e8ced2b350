"""Ollama's API beside OpenAI's, for the desktop tools that speak only Ollama: a translation onto the chat path.

    GET  /api/version   {"version"}
    GET  /api/tags      the loaded package as the one model, with its family, size and quantization
    GET  /api/ps        the same model, loaded (it always is)
    POST /api/show      {"model"} -> its details, chat template and capabilities
    POST /api/chat      {"model", "messages", "tools"?, "format"?, "options"?, "stream"?} -> the assistant's message
    POST /api/generate  {"model", "prompt", "system"?, "raw"?, "format"?, "options"?, "stream"?} -> "response"

A chat or generate body becomes the OpenAI chat body it means (its `options` under edgelm's names, `format` "json"
or a JSON schema as response_format, tool calls' arguments as JSON text) and runs on the chat endpoint's path
(chat.py), so every check, bound and tool format is the same. `raw: true` sends the prompt as it is, without the
chat template. Answers are Ollama's shapes: one JSON object, or with `stream` (Ollama's default: true) one JSON
object per line, the last with `"done": true`, the token counts and `total_duration` (nanoseconds). An error is
`{"error": message}` with the HTTP status; a stream that fails after it began ends with such a line.

Options with no meaning here (memory and thread placement: num_ctx, num_thread, num_gpu, ...) are accepted and
ignored, as Ollama's own server ignores what does not apply; any other unknown option is refused by name.
"""

import hashlib
import json
import time
from datetime import datetime, timezone
from importlib import metadata

from starlette.responses import Response

from ..api_errors import ApiError
from ..request_path import StreamWriter
from .chat import Chat
from .chat_requests import parse_chat_request

# Ollama's option -> the chat body's field
RENAMED = {
    "num_predict": "max_tokens",
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "typical_p": "typical_p",
    "repeat_penalty": "repetition_penalty",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "seed": "seed",
    "stop": "stop",
}
# where a model runs and how much it may hold: the package and edgelm serve's own options decide these
IGNORED = {
    "num_ctx", "num_batch", "num_gpu", "main_gpu", "low_vram", "f16_kv", "logits_all", "vocab_only", "use_mmap",
    "use_mlock", "embedding_only", "num_thread", "numa", "num_keep",
}  # fmt: skip
# defaults Ollama sends that change nothing: refused only at another value
NO_OP = {"repeat_last_n": (64,), "tfs_z": (1, 1.0), "mirostat": (0,), "penalize_newline": (True, False)}
CHAT_FIELDS = {"model", "messages", "tools", "format", "options", "stream", "keep_alive", "think"}
GENERATE_FIELDS = {"model", "prompt", "system", "raw", "format", "options", "stream", "keep_alive", "think", "template"}


def version() -> dict:
    return {"version": metadata.version("edgelm")}


def now() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def chat_body(body) -> dict:
    """An Ollama /api/chat body as the OpenAI chat body it means; ApiError names the Ollama field at fault."""
    body = _object(body, CHAT_FIELDS)
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise ApiError(400, 'messages must be a list like [{"role": "user", "content": "Hi"}]', "messages")
    return _common(body) | {"messages": _messages(messages)} | _tools(body)


def generate_body(body) -> dict:
    """An Ollama /api/generate body as a chat body: the prompt as the user's message (after `system`), or with
    raw: true as the model's own text with no template."""
    body = _object(body, GENERATE_FIELDS)
    prompt, system = body.get("prompt", ""), body.get("system")
    if not isinstance(prompt, str):
        raise ApiError(400, "prompt must be a string", "prompt")
    if system is not None and not isinstance(system, str):
        raise ApiError(400, "system must be a string", "system")
    if body.get("template") not in (None, ""):
        raise ApiError(400, "template is the package's chat template here; send raw: true for a prompt of your own", "template")
    if body.get("raw") is True:
        if system:
            raise ApiError(400, "system goes with the chat template; raw: true sends the prompt as it is", "system")
        return _common(body) | {"prompt": prompt}
    if body.get("raw") not in (None, False):
        raise ApiError(400, "raw must be true or false", "raw")
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    return _common(body) | {"messages": messages}


def _object(body, fields: set) -> dict:
    if not isinstance(body, dict):
        raise ApiError(400, "the body must be a JSON object")
    unknown = sorted(set(body) - fields)
    if unknown:
        raise ApiError(400, f"unknown field {unknown[0]!r}; this server takes {', '.join(sorted(fields))}", unknown[0])
    if body.get("think") not in (None, False):
        raise ApiError(400, "think: edgelm's packages have no thinking mode", "think")
    return body


def _common(body: dict) -> dict:
    """model, stream (Ollama's default: true), format and options, in the chat body's names."""
    out = {"stream": body.get("stream", True)}
    if not isinstance(out["stream"], bool):
        raise ApiError(400, "stream must be true or false", "stream")
    if "model" in body:
        out["model"] = body["model"]
    fmt = body.get("format")
    if fmt == "json":
        out["response_format"] = {"type": "json_object"}
    elif isinstance(fmt, dict):
        out["response_format"] = {"type": "json_schema", "json_schema": {"name": "format", "schema": fmt}}
    elif fmt not in (None, ""):
        raise ApiError(400, 'format must be "json" or a JSON schema (an object)', "format")
    options = body.get("options") or {}
    if not isinstance(options, dict):
        raise ApiError(400, "options must be an object of model options", "options")
    for name, value in options.items():
        if name in RENAMED:
            if name == "num_predict" and isinstance(value, int) and value < 0:
                continue  # -1 (no limit) and -2 (fill the context): what the context leaves, as without it
            out[RENAMED[name]] = value
        elif name in NO_OP:
            if value not in NO_OP[name] or isinstance(value, bool) != isinstance(NO_OP[name][0], bool):
                raise ApiError(400, f"options.{name} is not supported (only {NO_OP[name][0]!r})", f"options.{name}")
        elif name not in IGNORED:
            known = ", ".join(sorted(RENAMED))
            raise ApiError(400, f"unknown option {name!r}; the options that apply are {known}", f"options.{name}")
    return out


def _messages(messages: list) -> list:
    """Ollama's messages as OpenAI's: tool calls' arguments as JSON text, with ids; each tool result tied to the
    open call its tool_name names (else the first still open), as OpenAI's tool_call_id does; images refused."""
    out, open_calls = [], []  # open_calls: (id, name) of the last assistant message's calls not yet answered
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            out.append(message)  # the chat template names it
            continue
        if message.get("images"):
            raise ApiError(400, "images: edgelm's packages read text only", f"messages[{i}].images")
        converted = {k: v for k, v in message.items() if k not in ("images", "thinking", "tool_name", "tool_calls")}
        if message.get("tool_calls"):
            calls = message["tool_calls"]
            if not isinstance(calls, list):
                raise ApiError(400, "tool_calls must be a list", f"messages[{i}].tool_calls")
            converted["tool_calls"] = [_call(call, i, j) for j, call in enumerate(calls)]
            converted.setdefault("content", None)
            open_calls = [(c["id"], c["function"]["name"]) for c in converted["tool_calls"]]
        if message.get("role") == "tool":
            named = [c for c in open_calls if c[1] == message.get("tool_name")] or open_calls
            if not named:
                raise ApiError(400, "a tool message answers no call of the assistant message before it", f"messages[{i}]")
            converted["tool_call_id"] = named[0][0]
            open_calls.remove(named[0])
        out.append(converted)
    return out


def _call(call, i: int, j: int) -> dict:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise ApiError(400, 'a tool call is {"function": {"name", "arguments"}}', f"messages[{i}].tool_calls[{j}]")
    arguments = function.get("arguments", {})
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": f"call_{i}_{j}", "type": "function", "function": {"name": function["name"], "arguments": text}}


def _tools(body: dict) -> dict:
    return {"tools": body["tools"], "tool_choice": "auto"} if body.get("tools") else {}


def ollama_error(error: ApiError) -> Response:
    return Response(json.dumps({"error": error.message}), error.status, error.headers, media_type="application/json")


class OllamaChat(Chat):
    """POST /api/chat (and /api/generate, `generate=True`): the chat endpoint with Ollama's body and answers."""

    def __init__(self, serving, generate: bool = False):
        super().__init__(serving)
        self.generate = generate

    def parse(self, body):
        translated = generate_body(body) if self.generate else chat_body(body)
        raw = translated.pop("prompt", None)
        if raw is not None:  # raw: a one-message conversation rendered as the prompt itself
            translated["messages"] = [{"role": "user", "content": raw}]
        serving = self.serving
        req = parse_chat_request(translated, serving.names, self.model.arch.vocab_size, serving.limits)
        req.raw, req.started = raw, time.monotonic()
        return req

    def prepare(self, req, config, deadline: float):
        if req.raw is None:
            return super().prepare(req, config, deadline)
        from ..request_path import Ready

        ids, options = self.model.encode(req.raw), dict(req.options)
        if req.max_tokens is None:
            req.max_tokens = max(1, min(req.default_max_tokens, self.model.arch.n_positions - len(ids)))
            options["max_new_tokens"] = req.max_tokens
        batch = self.model.batch([ids], config=self.model.settings(**options))
        return Ready(batch, [len(batch.prompts[0])])

    def answer(self, req, result):
        completion = super().answer(req, result)
        choice = completion.choices[0]
        message = choice.message
        out = {"model": self.serving.model_id, "created_at": now()}
        if self.generate:
            out["response"] = message.content or ""
        else:
            out["message"] = {"role": "assistant", "content": message.content or ""}
            if message.tool_calls:
                out["message"]["tool_calls"] = [_ollama_call(call) for call in message.tool_calls]
        return out | _done(req, result, "stop" if choice.finish_reason == "tool_calls" else choice.finish_reason)

    def writer(self, req, ready):
        return OllamaStream(req, self.serving.model_id, self.generate)


def _ollama_call(call) -> dict:
    call = call if isinstance(call, dict) else call.model_dump()
    function = call["function"]
    try:
        arguments = json.loads(function["arguments"])
    except (TypeError, ValueError):
        arguments = function["arguments"]
    return {"function": {"name": function["name"], "arguments": arguments}}


def _done(req, result, reason: str) -> dict:
    return {
        "done": True,
        "done_reason": reason,
        "total_duration": int((time.monotonic() - req.started) * 1e9),
        "prompt_eval_count": sum(result.prompt_tokens),
        "eval_count": result.tokens,
    }


class OllamaStream(StreamWriter):
    """One JSON object per line: each piece of text as it becomes final, the tool calls once complete, then the
    line with done: true and the counts. An error after the start is a last {"error"} line."""

    media_type = "application/x-ndjson"

    def __init__(self, req, model_id: str, generate: bool):
        self.req, self.model_id, self.generate = req, model_id, generate
        self.reader = req.tool_format.stream() if req.tools.active else None
        self.calls, self.started = {}, False

    def line(self, text: str = "", calls=None, last: dict | None = None) -> str:
        out = {"model": self.model_id, "created_at": now()}
        if self.generate:
            out["response"] = text
        else:
            out["message"] = {"role": "assistant", "content": text}
            if calls:
                out["message"]["tool_calls"] = calls
        return json.dumps(out | (last or {"done": False})) + "\n"

    def event(self, kind: str, value) -> list:
        piece, _ = value
        if self.reader is None:
            return self._text(piece.text)
        return self._read(self.reader.feed(piece.text))

    def closing(self, result) -> list:
        out = self._read(self.reader.finish()) if self.reader is not None else []
        calls = [
            {"function": {"name": name, "arguments": _arguments(text)}} for name, text in self.calls.values()
        ]
        completion = result.completions[0]
        reason = "stop" if calls else completion.finish_reason
        return out + [self.line("", calls or None, _done(self.req, result, reason))]

    def error(self, error) -> str:
        return json.dumps({"error": error.message}) + "\n"

    def _read(self, deltas: list) -> list:
        out = []
        for delta in deltas:
            if hasattr(delta, "text"):
                out += self._text(delta.text)
            elif self.req.tools.parallel or delta.index == 0:
                name, text = self.calls.get(delta.index, (delta.name, ""))
                self.calls[delta.index] = (name or delta.name, text + (delta.arguments or ""))
        return out

    def _text(self, text: str) -> list:
        if not self.started:
            text = text.lstrip()  # the default template's answers begin with a space
            self.started = bool(text)
        return [self.line(text)] if text else []


def _arguments(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return text


def details(model) -> dict:
    """Ollama's `details` of the loaded package: format, family, parameter count, quantization."""
    manifest = model.package.manifest
    weights = getattr(manifest, "weights", None)
    quantization = getattr(weights, "dtype", None) or "unknown"
    parameters = _parameters(model)
    family = model.arch.model_type
    return {
        "parent_model": "",
        "format": "onnx",
        "family": family,
        "families": [family],
        "parameter_size": f"{parameters / 1e6:.0f}M" if parameters < 1e9 else f"{parameters / 1e9:.1f}B",
        "quantization_level": quantization.upper(),
    }


def _parameters(model) -> int:
    arch = model.arch
    per_layer = 12 * arch.n_embd * arch.n_embd  # attention and a 4x MLP, as a size class, not an exact count
    return arch.n_layer * per_layer + arch.vocab_size * arch.n_embd


def model_entry(model, model_id: str) -> dict:
    manifest = model.package.manifest
    size = sum(record.size for record in manifest.files.values()) if manifest else model.package.weight_bytes
    modified = datetime.fromtimestamp(model.package.model_file.stat().st_mtime, timezone.utc)
    listed = model.package.folder / "manifest.json"  # its files' sha256s: the package's identity
    digest = hashlib.sha256(listed.read_bytes()).hexdigest() if manifest and listed.is_file() else ""
    return {
        "name": model_id,
        "model": model_id,
        "modified_at": modified.isoformat().replace("+00:00", "Z"),
        "size": size,
        "digest": digest,
        "details": details(model),
    }


def show(model, model_id: str, body) -> dict:
    if not isinstance(body, dict) or not isinstance(body.get("model", body.get("name")), str):
        raise ApiError(400, 'send {"model": NAME}', "model")
    entry = model_entry(model, model_id)
    capabilities = ["completion", "tools"]  # a template that does not render tools gets them in a message
    return {
        "modified_at": entry["modified_at"],
        "template": model.chat_template.source,
        "modelfile": "",
        "parameters": "",
        "license": "",
        "details": entry["details"],
        "model_info": {
            "general.architecture": model.arch.model_type,
            "general.parameter_count": _parameters(model),
            f"{model.arch.model_type}.context_length": model.arch.n_positions,
            f"{model.arch.model_type}.embedding_length": model.arch.n_embd,
            f"{model.arch.model_type}.block_count": model.arch.n_layer,
        },
        "capabilities": capabilities,
    }
