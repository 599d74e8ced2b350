"""POST /v1/chat/completions: OpenAI's chat endpoint over Model.chat_batch, on the same jobs as completions.

A request is read and parsed (chat_requests.py), its settings built once (Model.settings), the conversation
rendered by the package's chat template and tokenized in a worker thread (a template error names the message
at fault), then it waits for a slot and runs as a Job: the same queue, limits, deadline and cancellation as
/v1/completions (waiting.py, jobs.py). The answer is OpenAI's `chat.completion`, or a stream of
`chat.completion.chunk` events ending in `data: [DONE]`.
"""

import asyncio
import time

from ..errors import ChatError, EdgelmError
from ..text.chat_bounds import deadline as render_deadline
from . import chat_responses as shapes
from .bodies import json_response, read_json
from .chat_requests import parse_chat_request
from .errors import ApiError, api_error
from .jobs import Stopped, Work
from .requests import check_tokens_held
from .responses import usage
from .waiting import admit, answer_of, event_stream, runtime_errors


def chat_endpoint(model, jobs, names, limits, model_id: str):
    """The request handler for /v1/chat/completions on `model`."""

    async def chat_completions(request):
        deadline = time.monotonic() + limits.request_timeout
        body = await read_json(request, limits, deadline)
        req = parse_chat_request(body, names, model.arch.vocab_size, limits)
        try:
            config = model.settings(**req.options)  # every option's range, checked once
        except EdgelmError as error:
            raise api_error(error, field_of=req.field_of) from None
        try:
            batch = await runtime_errors(asyncio.to_thread(_prepare, model, req, config, deadline), req)
        except ApiError as error:
            if error.param == "prompt":  # the rendered conversation: what the client sent is its messages
                error.param = "messages"
            raise
        prompt_tokens = len(batch.prompts[0])
        check_tokens_held(req, [prompt_tokens], limits)
        work = ChatWork(batch)
        del batch  # from here the job holds it, and drops it when it ends
        job = await admit(request, jobs, work, deadline, limits)
        del work
        if req.stream:
            return event_stream(job, _events(request, job, req, model_id, prompt_tokens, limits))
        completions = await answer_of(request, job, limits, req.field_of)
        tokens = sum(c.completion_tokens for c in completions)
        request.state.tokens = tokens
        return json_response(shapes.completion(req, model_id, completions, usage(prompt_tokens, tokens)))

    return chat_completions


def _prepare(model, req, config, at: float):
    """The Batch for the assistant's reply (worker thread: rendering and tokenizing must not block the loop; a
    render stops at the request's deadline, `at`, so none holds the thread past it). Without max_tokens the
    reply may fill what the context leaves, up to the server's --max-tokens-limit."""
    try:
        with render_deadline(at):
            if req.max_tokens is None:
                prompt = model.chat_template.render(req.messages, add_generation_prompt=True)
                room = model.arch.n_positions - len(model.encode(prompt))
                req.max_tokens = max(1, min(req.default_max_tokens, room))
                config = config.with_options(max_new_tokens=req.max_tokens)
            return model.chat_batch(req.messages, config=config)
    except EdgelmError as error:
        if isinstance(error, ChatError) and error.param is None:  # the template failed on these messages
            error.param = "messages"
        raise


class ChatWork(Work):
    """The model thread's part: pieces as they come (each with the log-prob entries of the tokens it covers),
    then the completions."""

    def __init__(self, batch):
        self.batch, self.sent = batch, [0] * len(batch.rows)  # log-prob entries handed out per row

    def piece(self, job, piece) -> None:
        entries = self.batch.logprobs_so_far(piece.index)
        if entries is not None:
            entries, self.sent[piece.index] = entries[self.sent[piece.index] :], len(entries)
        job.emit("piece", (piece, entries))


async def _events(request, job, req, model_id, prompt_tokens, limits):
    """Server-sent events: each choice's role, its text pieces as they become final (the first without leading
    whitespace), a finish chunk per choice (with the log-probs no piece covered), usage if asked, [DONE].
    A stream that fails after it began ends with an error event (OpenAI's error body) and no [DONE]."""

    def sse(choices, usage=None) -> str:
        return f"data: {shapes.chunk(req, model_id, choices, usage).model_dump_json()}\n\n"

    completions = None
    entries_sent, started = [0] * req.n, [False] * req.n  # per choice: entries sent; content begun
    try:
        for i in range(req.n):  # one choice per chunk, as OpenAI sends them
            yield sse([shapes.ChunkChoice(index=i, delta={"role": "assistant", "content": ""})])
        async for kind, value in job:
            if kind == "piece":
                piece, entries = value
                text = piece.text if started[piece.index] else shapes.answer(piece.text)
                started[piece.index] = started[piece.index] or bool(text)
                entries_sent[piece.index] += len(entries or [])
                if text or entries:
                    lp = shapes.logprobs(req, entries)
                    yield sse([shapes.ChunkChoice(index=piece.index, delta={"content": text}, logprobs=lp)])
            elif kind == "done":
                completions = value
            elif kind == "error":
                if not (isinstance(value, Stopped) and value.reason == "cancelled"):
                    error = api_error(value, limits.request_timeout, req.field_of)
                    request.state.error = error.status
                    yield f"data: {error.json().decode()}\n\n"
                return
        tokens = sum(c.completion_tokens for c in completions)
        request.state.tokens = tokens
        for c in completions:
            left = (c.logprobs or [])[entries_sent[c.index] :]  # tokens no piece covered (held back, or cut by a stop)
            lp = shapes.logprobs(req, left) if left else None
            yield sse([shapes.ChunkChoice(index=c.index, delta={}, logprobs=lp, finish_reason=c.finish_reason)])
        if req.include_usage:
            yield sse([], usage(prompt_tokens, tokens))
        yield "data: [DONE]\n\n"
    finally:  # normal end, or the client went away (Starlette cancels this generator): stop the generation
        job.stop()
