"""POST /v1/chat/completions: OpenAI's chat endpoint over the package's chat template, on the same path as
completions (request_path.py).

The body is parsed by chat_requests.py; the conversation is rendered by the package's chat template and
tokenized once, in a worker thread (a template error names the message at fault); the answer is OpenAI's
`chat.completion`, or a stream of `chat.completion.chunk` events ending in `data: [DONE]` (chat_answers.py).
"""

from ...text.chat_bounds import deadline as render_deadline
from ..request_path import Endpoint, Ready, Result, StreamWriter, sse
from ..template_process import RENDER_ELSEWHERE_FROM
from . import chat_answers as shapes
from .chat_requests import ChatRequest, parse_chat_request
from .completion_answers import usage
from .tool_calls import finish_reason, named_as_tools


class Chat(Endpoint):
    def parse(self, body) -> ChatRequest:
        serving = self.serving
        return parse_chat_request(body, serving.names, self.model.arch.vocab_size, serving.limits)

    def settings(self, req: ChatRequest):
        """None: a chat request's settings are built once, in prepare, when its prompt is counted."""
        return None

    def prepare(self, req: ChatRequest, config, deadline: float) -> Ready:
        """The Batch for the assistant's reply, its conversation (and tools) rendered and tokenized once; a call
        forced by tool_choice constrains the reply. Without max_tokens the reply may fill what the context
        leaves, up to the server's --max-tokens-limit. A render stops at the request's deadline. The settings
        are built once, from the request's options, the tools' constraint, the template's stop strings and the
        reply's length."""
        model, tools, options = self.model, req.tools, dict(req.options)
        if tools.active:
            from ...text.tools import tool_format

            tools.check_schemas()
            if req.answer_format:  # checked alone first, so that a bad schema names response_format
                model.settings(**req.answer_format)
            req.tool_format = tool_format(model)
            options.update(tools.constraint(req.tool_format, req.answer_format))
        ids = self._prompt_ids(req, tools.tools if tools.active else None, deadline)
        if req.max_tokens is None:
            req.max_tokens = max(1, min(req.default_max_tokens, model.arch.n_positions - len(ids)))
            options["max_new_tokens"] = req.max_tokens
        stop = options.get("stop", model.defaults.stop)  # the request's (a string or a list), else the package's
        options["stop"] = model.chat_stop((stop,) if isinstance(stop, str) else tuple(stop))
        with named_as_tools(tools, req.field_of):  # the grammar is edgelm's: its errors are said of the tools
            batch = model.batch([ids], config=model.settings(**options))
        return Ready(batch, [len(batch.prompts[0])])

    def _prompt_ids(self, req: ChatRequest, tools, deadline: float) -> list:
        """The conversation's prompt ids, as model.chat_ids makes them; a large body's template renders in the
        server's template process (template_process.py), so that its Python does not hold this process's GIL."""
        templates = self.serving.templates
        if templates is not None and req.body_bytes >= RENDER_ELSEWHERE_FROM:
            prompt = templates.render(req.messages, tools, deadline)
            ids = self.model.encode(prompt, add_special_tokens=False)  # the template wrote the start token, if any
            with render_deadline(deadline):
                self.model.mark_conversation_start(req.messages, tools, ids)  # as chat_ids does
            return ids
        with render_deadline(deadline):
            return self.model.chat_ids(req.messages, tools=tools)

    def answer(self, req: ChatRequest, result: Result):
        counted = usage(sum(result.prompt_tokens), result.tokens, result.speculation)
        return shapes.completion(req, self.serving.model_id, result.completions, counted, req.tool_format)

    def writer(self, req: ChatRequest, ready: Ready) -> StreamWriter:
        return ChatStream(req, self.serving.model_id)


class ChatStream(StreamWriter):
    """Each choice's role, its text pieces as they become final (the first without leading whitespace), a finish
    chunk per choice (with the log-probs no piece covered), usage if asked, [DONE]. With tools in use each
    choice's text goes through the format's stream: content streams at once, a call once it is complete, as
    delta.tool_calls; log-prob entries ride on the next chunk sent."""

    def __init__(self, req: ChatRequest, model_id: str):
        self.req, self.model_id = req, model_id
        self.entries_sent, self.started = [0] * req.n, [False] * req.n  # per choice: entries sent; content begun
        self.pending = [[] for _ in range(req.n)]  # per choice: log-prob entries not yet sent with a chunk
        self.calls = [0] * req.n  # per choice: calls sent
        tools = req.tools
        self.readers = [req.tool_format.stream() for _ in range(req.n)] if tools.active else None

    def chunk(self, choices: list, usage=None) -> str:
        return sse(shapes.chunk(self.req, self.model_id, choices, usage))

    def opening(self) -> list:
        # one choice per chunk, as OpenAI sends them
        return [
            self.chunk([shapes.ChunkChoice(index=i, delta={"role": "assistant", "content": ""})])
            for i in range(self.req.n)
        ]

    def event(self, kind: str, value) -> list:
        piece, entries = value
        i = piece.index
        self.pending[i] += entries or []
        if self.readers is None:
            return self._deltas(i, [{"content": piece.text}])
        return self._deltas(i, self._read(i, self.readers[i].feed(piece.text)))

    def closing(self, result: Result) -> list:
        out = []
        for c in result.completions:
            i = c.index
            if self.readers is not None:
                out += self._deltas(i, self._read(i, self.readers[i].finish(cut=c.finish_reason == "length")))
            left = (c.logprobs or [])[self.entries_sent[i] :]  # tokens no chunk carried (held back, or cut by a stop)
            lp = shapes.logprobs(self.req, left) if left else None
            reason = finish_reason(c.finish_reason, self.calls[i])
            out.append(self.chunk([shapes.ChunkChoice(index=i, delta={}, logprobs=lp, finish_reason=reason)]))
        if self.req.include_usage:
            out.append(self.chunk([], usage(sum(result.prompt_tokens), result.tokens, result.speculation)))
        return out + ["data: [DONE]\n\n"]

    def _read(self, i: int, deltas: list) -> list:
        """The format stream's deltas as chunk deltas; with parallel_tool_calls false, the first call only."""
        out = []
        for delta in deltas:
            if hasattr(delta, "text"):
                out.append({"content": delta.text})
            elif self.req.tools.parallel or delta.index == 0:
                self.calls[i] = max(self.calls[i], delta.index + 1)
                out.append(shapes.call_deltas(delta))
        return out

    def _deltas(self, i: int, deltas: list) -> list:
        out = []
        for delta in deltas:
            if "content" in delta:
                text = delta["content"] if self.started[i] else shapes.answer(delta["content"])
                self.started[i] = self.started[i] or bool(text)
                if not (text or self.pending[i]):
                    continue
                delta = {"content": text}
            out.append(self._with_entries(i, delta))
        return out

    def _with_entries(self, i: int, delta: dict) -> str:
        entries, self.pending[i] = self.pending[i], []
        self.entries_sent[i] += len(entries)
        lp = shapes.logprobs(self.req, entries)
        return self.chunk([shapes.ChunkChoice(index=i, delta=delta, logprobs=lp)])
