"""POST /v1/chat/completions: OpenAI's chat endpoint over the package's chat template, on the same path as
completions (pipeline.py).

The body is parsed by chat_requests.py; the conversation is rendered by the package's chat template and
tokenized once, in a worker thread (a template error names the message at fault); the answer is OpenAI's
`chat.completion`, or a stream of `chat.completion.chunk` events ending in `data: [DONE]` (chat_responses.py).
"""

from ..text.chat_bounds import deadline as render_deadline
from . import chat_responses as shapes
from .chat_requests import ChatRequest, parse_chat_request
from .pipeline import Endpoint, Ready, Result, StreamWriter, sse
from .responses import usage


class Chat(Endpoint):
    def parse(self, body) -> ChatRequest:
        serving = self.serving
        return parse_chat_request(body, serving.names, self.model.arch.vocab_size, serving.limits)

    def prepare(self, req: ChatRequest, config, deadline: float) -> Ready:
        """The Batch for the assistant's reply, its conversation rendered and tokenized once (a render stops at the
        request's deadline, so none holds the worker thread past it). Without max_tokens the reply may fill what
        the context leaves, up to the server's --max-tokens-limit."""
        model = self.model
        with render_deadline(deadline):
            ids, config = model.chat_prompt(req.messages, config)
        if req.max_tokens is None:
            req.max_tokens = max(1, min(req.default_max_tokens, model.arch.n_positions - len(ids)))
            config = config.with_options(max_new_tokens=req.max_tokens)
        batch = model.batch([ids], config=config)
        return Ready(batch, [len(batch.prompts[0])])

    def answer(self, req: ChatRequest, result: Result):
        return shapes.completion(
            req, self.serving.model_id, result.completions, usage(sum(result.prompt_tokens), result.tokens)
        )

    def writer(self, req: ChatRequest, ready: Ready) -> StreamWriter:
        return ChatStream(req, self.serving.model_id)


class ChatStream(StreamWriter):
    """Each choice's role, its text pieces as they become final (the first without leading whitespace), a finish
    chunk per choice (with the log-probs no piece covered), usage if asked, [DONE]."""

    def __init__(self, req: ChatRequest, model_id: str):
        self.req, self.model_id = req, model_id
        self.entries_sent, self.started = [0] * req.n, [False] * req.n  # per choice: entries sent; content begun

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
        text = piece.text if self.started[i] else shapes.answer(piece.text)
        self.started[i] = self.started[i] or bool(text)
        self.entries_sent[i] += len(entries or [])
        if not (text or entries):
            return []
        lp = shapes.logprobs(self.req, entries)
        return [self.chunk([shapes.ChunkChoice(index=i, delta={"content": text}, logprobs=lp)])]

    def closing(self, result: Result) -> list:
        out = []
        for c in result.completions:
            left = (c.logprobs or [])[
                self.entries_sent[c.index] :
            ]  # tokens no piece covered (held back, or cut by a stop)
            lp = shapes.logprobs(self.req, left) if left else None
            out.append(
                self.chunk([shapes.ChunkChoice(index=c.index, delta={}, logprobs=lp, finish_reason=c.finish_reason)])
            )
        if self.req.include_usage:
            out.append(self.chunk([], usage(sum(result.prompt_tokens), result.tokens)))
        return out + ["data: [DONE]\n\n"]
