"""POST /v1/completions: OpenAI's legacy completions over Model.batch, streamed or not; prompts as text or token ids.

The body is parsed by requests.py, runs through the one request path (request_path.py), and is answered in the
shapes of completion_answers.py: a `text_completion`, or a stream of them ending in `data: [DONE]`. With echo the prompt
comes first (with logprobs, once the prompts are scored, with their log-probs); max_tokens 0 generates nothing.
"""

from ...text import tokenizer as tokenizing
from ..request_path import Endpoint, Ready, Result, StreamWriter, sse
from . import completion_answers as answers
from .requests import CompletionRequest, parse_completion_request


class Completions(Endpoint):
    def parse(self, body) -> CompletionRequest:
        serving = self.serving
        return parse_completion_request(body, serving.names, self.model.arch.vocab_size, serving.limits)

    def prepare(self, req: CompletionRequest, config, deadline: float) -> Ready:
        """Tokenize and check the prompts; note each prompt's text (a token-id prompt decoded) for echo and
        text_offset; echo with logprobs scores the prompts first, in the model's thread."""
        model = self.model
        req.prompt_texts = [p if isinstance(p, str) else tokenizing.decode(model.tokenizer, p) for p in req.prompts]
        before = None
        if req.echo and req.logprobs is not None:

            def before():
                return [model.score(p, top_logprobs=req.logprobs) if len(p) else None for p in req.prompts]

        if req.max_tokens == 0:  # echo only: nothing to generate
            counts = [max(len(p if isinstance(p, list) else model.encode(p)), 1) for p in req.prompts]
            return Ready(None, counts, before)
        batch = model.batch(req.prompts, config=config)
        return Ready(batch, [len(ids) for ids in batch.prompts], before)

    def answer(self, req: CompletionRequest, result: Result):
        choices = answers.choices(req, result.completions, result.before)
        usage = answers.usage(sum(result.prompt_tokens), result.tokens, result.speculation)
        return answers.completion(req, self.serving.model_id, choices, usage)

    def writer(self, req: CompletionRequest, ready: Ready) -> StreamWriter:
        return CompletionStream(req, self.serving.model_id)


class CompletionStream(StreamWriter):
    """The echo (with logprobs: once the prompts are scored, with their log-probs), text pieces as they become
    final (each with the log-probs of the tokens it covers), a finish chunk per choice (with the log-probs of
    tokens no piece covered), usage if asked, [DONE]."""

    def __init__(self, req: CompletionRequest, model_id: str):
        self.req, self.model_id = req, model_id
        rows = len(req.prompts) * req.n
        # per choice: log-prob entries sent so far, and the text_offset of the next (as answers.logprobs counts it)
        self.entries_sent = [0] * rows
        self.offsets = [len(req.prompt_texts[i // req.n]) for i in range(rows)]

    def chunk(self, choices: list, usage=None) -> str:
        return sse(answers.completion(self.req, self.model_id, choices, usage))

    def echo(self, scores) -> str:
        req = self.req
        echoed = [
            answers.choice(
                i,
                req.prompt_texts[i // req.n],
                answers.logprobs(req, answers.prompt_entries(scores[i // req.n] if scores else None), 0),
            )
            for i in range(len(req.prompts) * req.n)
        ]
        return self.chunk(echoed)

    def opening(self) -> list:
        return [self.echo(None)] if self.req.echo and self.req.logprobs is None else []  # with logprobs: once scored

    def event(self, kind: str, value) -> list:
        if kind == "before":
            return [self.echo(value)]
        piece, entries = value
        entries = entries or []
        lp = answers.logprobs(self.req, entries, self.offsets[piece.index])
        self.entries_sent[piece.index] += len(entries)
        self.offsets[piece.index] += sum(len(e["token"]) for e in entries)
        return [self.chunk([answers.choice(piece.index, piece.text, lp)])]

    def closing(self, result: Result) -> list:
        req, completions = self.req, result.completions
        out = []
        for c in answers.choices(req, completions, None):
            # the log-probs of tokens no piece covered (text held back, or cut by a stop string)
            left = (completions[c.index].logprobs or [])[self.entries_sent[c.index] :] if completions else []
            lp = answers.logprobs(req, left, self.offsets[c.index])
            out.append(self.chunk([answers.choice(c.index, "", lp, c.finish_reason)]))
        if req.include_usage:
            out.append(self.chunk([], answers.usage(sum(result.prompt_tokens), result.tokens, result.speculation)))
        return out + ["data: [DONE]\n\n"]
