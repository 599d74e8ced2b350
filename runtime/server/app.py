"""The HTTP layer: Starlette routes over one loaded Model, with the middleware of middleware.py around them.

    GET  /health              {"status", "model", "active", "queued", jobs ended so far by outcome ("finished",
                              "cancelled", "timeout", "shutdown"), and "prefix_cache": PrefixCache.stats() or
                              null without one}                                  (no API key needed)
    GET  /v1/models           the loaded package as the one model (id: the first --model-name, else the package name)
    POST /v1/completions      OpenAI's legacy completions, streaming (server-sent events) or not; prompts as
                              text or token ids
    POST /v1/chat/completions OpenAI's chat completions, the prompt made by the package's chat template (chat.py)
    POST /v1/score            {"text"} -> per-token log-probs and perplexity (Model.score)
    POST /tokenize            {"content", "add_special"?} -> {"tokens": [ids]}      (llama-server's shapes)
    POST /detokenize          {"tokens": [ids]} -> {"content"}

A completion request is read (JSON only, within --read-timeout), parsed (requests.py), its settings built
once (Model.settings), tokenized, then waits for a slot and runs as a Job (jobs.py). A non-streaming request
that loses its client, or a stream whose client goes away, stops its job at once; the job then drops its
Batch, whatever ended it. Every error a request causes is answered in OpenAI's error shape on a connection
that stays usable; only a body that never arrives closes it.
"""

import asyncio
import functools
import logging
import time
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.responses import Response
from starlette.routing import Route

from ..batching.scheduler import Scheduler
from ..errors import EdgelmError
from ..text import tokenizer as tokenizing
from . import requests, responses
from .bodies import json_response, read_json
from .chat import chat_endpoint
from .errors import ApiError, api_error, describe
from .jobs import Jobs, Stopped, Work
from .middleware import AccessLog, ApiKey, HostCheck, cors
from .requests import Limits, ModelNames
from .text_work import TextWork
from .waiting import ClientGone, admit, answer_of, event_stream, job_result, runtime_errors, unless_gone

log = logging.getLogger("edgelm.server")


def create_app(
    model,
    limits: Limits = Limits(),
    max_concurrency: int = 2,
    max_queue: int = 64,
    api_key: str | None = None,
    host: str = "127.0.0.1",
    allow_hosts: tuple = (),
    allow_origins: tuple = (),
    model_names: tuple = (),
    accept_any_model: bool = False,
    max_batch: int = 16,
):
    """The ASGI application serving `model` (a runtime Model, loaded once) on `host` (for the Host check).
    Requests may name it by the package's name or any of `model_names` (the first is the id it is listed as),
    or by any name with `accept_any_model`. Its `jobs` are the slots and where they run: one running batch of
    up to `max_batch` rows (continuous batching) where the model's decoders write their cache in place and
    max_batch > 0, else `max_concurrency` worker threads, a request each."""
    jobs = jobs_for(model, max_batch, max_concurrency, max_queue)
    names = model_names_for(model, model_names, accept_any_model)
    model_id = names.id

    prefix_cache = model.engine.prefix_cache

    async def health(request):
        return json_response(
            {
                "status": "ok",
                "model": model_id,
                "active": jobs.slots.active,
                "queued": jobs.slots.queued,
                **jobs.ended,
                "prefix_cache": None if prefix_cache is None else prefix_cache.stats(),
            }
        )

    async def models(request):
        return json_response({"object": "list", "data": [_model_card(model, model_id)]})

    async def one_model(request):
        names.check(request.path_params["name"])
        return json_response(_model_card(model, model_id))

    async def completions(request):
        deadline = time.monotonic() + limits.request_timeout
        body = await read_json(request, limits, deadline)
        req = requests.parse_completion_request(body, names, model.arch.vocab_size, limits)
        try:
            config = model.settings(**req.options)  # every option's range, checked once
        except EdgelmError as error:
            raise api_error(error, field_of=req.field_of) from None
        generation, prompt_counts = await runtime_errors(asyncio.to_thread(_prepare, model, req, config), req)
        requests.check_tokens_held(req, prompt_counts, limits)
        work = CompletionWork(model, req, generation)
        del generation  # from here the job holds it, and drops it when it ends
        job = await admit(request, jobs, work, deadline, limits)
        del work
        if req.stream:
            return event_stream(job, _events(request, job, req, model_id, prompt_counts, limits))
        completions, scores = await answer_of(request, job, limits, req.field_of)
        tokens = sum(c.completion_tokens for c in completions or [])
        request.state.tokens = tokens
        return json_response(
            responses.completion(
                req, model_id, responses.choices(req, completions, scores), responses.usage(sum(prompt_counts), tokens)
            )
        )

    async def score(request):
        deadline = time.monotonic() + limits.request_timeout
        text = requests.parse_score_request(await read_json(request, limits, deadline), names)
        job = await admit(request, jobs, ScoreWork(model, text), deadline, limits)
        try:
            result = await unless_gone(request, job_result(job), job)
        except ClientGone:
            raise
        except EdgelmError as error:
            error = api_error(error)
            raise ApiError(error.status, error.message, "text", error.code) from None
        except Exception as error:
            raise api_error(error, limits.request_timeout) from None
        request.state.tokens = len(result.token_ids)
        return json_response(responses.score(result, model_id))

    text_work = TextWork(model)

    async def tokenize(request):
        deadline = time.monotonic() + limits.request_timeout
        parsed = requests.parse_tokenize_request(await read_json(request, limits, deadline))
        try:
            content = await text_work.tokens(parsed.content, parsed.add_special, deadline)
        except EdgelmError as error:  # the package's tokenizer failed on this text
            raise ApiError(400, str(error), "content") from None
        return Response(content, media_type="application/json")

    async def detokenize(request):
        deadline = time.monotonic() + limits.request_timeout
        ids = requests.parse_detokenize_request(await read_json(request, limits, deadline), model.arch.vocab_size)
        try:
            content = await text_work.text(ids, deadline)
        except EdgelmError as error:
            raise ApiError(400, str(error), "tokens") from None
        return Response(content, media_type="application/json")

    @asynccontextmanager
    async def lifespan(app):
        yield
        await jobs.shutdown()
        text_work.close()

    routes = [
        Route("/health", _endpoint(health)),
        Route("/v1/models", _endpoint(models)),
        Route("/v1/models/{name:path}", _endpoint(one_model)),
        Route("/v1/completions", _endpoint(completions), methods=["POST"]),
        Route("/v1/chat/completions", _endpoint(chat_endpoint(model, jobs, names, limits, model_id)), methods=["POST"]),
        Route("/v1/score", _endpoint(score), methods=["POST"]),
        Route("/tokenize", _endpoint(tokenize), methods=["POST"]),
        Route("/detokenize", _endpoint(detokenize), methods=["POST"]),
    ]
    handlers = {
        ApiError: _error_response,
        HTTPException: _http_error,
        ClientGone: _client_gone,
        Exception: _server_error,
    }
    inner = ApiKey(Starlette(routes=routes, exception_handlers=handlers, lifespan=lifespan), api_key)
    app = AccessLog(HostCheck(cors(inner, tuple(allow_origins)), host, tuple(allow_hosts)))
    app.jobs, app.limits, app.names = jobs, limits, names
    return app


def jobs_for(model, max_batch: int, max_concurrency: int, max_queue: int) -> Jobs:
    """Continuous batching (runtime/batching/scheduler.py) where the engine can run it, else a worker thread per request."""
    if max_batch > 0 and batches_continuously(model):
        return Jobs(max_batch, max_queue, Scheduler(model, max_batch))
    return Jobs(max_concurrency, max_queue)


def batches_continuously(model) -> bool:
    """Whether `model` can join requests into one running batch: its decoders keep the cache in preallocated
    buffers (CPU, an edgelm graph that updates the cache in place). Otherwise each request decodes alone."""
    return model.engine.writes_cache_in_place


def model_names_for(model, names: tuple, accept_any: bool) -> ModelNames:
    """The id is the first --model-name (else the package's name); the package's name is always accepted, and so
    is the hub id it was exported from (`edgelm export distilgpt2 --quantize int8` makes distilgpt2-int8, which
    answers to model="distilgpt2" too)."""
    names = tuple(dict.fromkeys(names))  # repeated names once, in order
    manifest = model.package.manifest  # None for an optimum folder
    exported_from = manifest.source.get("hub_id") if manifest else None
    aliases = (*names[1:], model.package.name, *([exported_from] if isinstance(exported_from, str) else []))
    return ModelNames(names[0] if names else model.package.name, aliases, accept_any)


def _prepare(model, req, config) -> tuple:
    """Tokenize and check the prompts (worker thread: a long prompt must not block the event loop); note each
    prompt's text (a token-id prompt decoded) for echo and text_offset."""
    req.prompt_texts = [p if isinstance(p, str) else tokenizing.decode(model.tokenizer, p) for p in req.prompts]
    if req.max_tokens == 0:  # echo only: nothing to generate
        return None, [max(len(p if isinstance(p, list) else model.encode(p)), 1) for p in req.prompts]
    generation = model.batch(req.prompts, config=config)
    return generation, [len(ids) for ids in generation.prompts]


class CompletionWork(Work):
    """One completion request in the model's thread: the prompts' log-probs (echo with logprobs), pieces as they
    come (in a stream, each with the log-prob entries of the tokens it covers), then the completions."""

    def __init__(self, model, req, generation):
        self.model, self.req, self.batch = model, req, generation
        self.scores = None
        self.sent = [0] * len(generation.rows) if generation is not None else []  # log-prob entries sent per row

    def start(self, job) -> None:
        req = self.req
        if req.echo and req.logprobs is not None:
            self.scores = [self.model.score(p, top_logprobs=req.logprobs) if len(p) else None for p in req.prompts]
            job.emit("echo", self.scores)

    def piece(self, job, piece) -> None:
        entries = self.batch.logprobs_so_far(piece.index) if self.req.stream else None
        if entries is not None:
            entries, self.sent[piece.index] = entries[self.sent[piece.index] :], len(entries)
        job.emit("piece", (piece, entries))

    def done(self, job) -> None:
        job.emit("done", (self.batch.completions if self.batch is not None else None, self.scores))


class ScoreWork(Work):
    def __init__(self, model, text):
        self.model, self.text = model, text

    def start(self, job) -> None:
        job.emit("done", self.model.score(self.text))

    def done(self, job) -> None:
        pass


async def _events(request, job, req, model_id, prompt_counts, limits):
    """Server-sent events: the echo (with logprobs: once the prompts are scored, with their log-probs), text
    pieces as they become final (each with the log-probs of the tokens it covers), a finish chunk per choice
    (with the log-probs of tokens no piece covered), usage if asked, [DONE].
    A stream that fails after it began ends with an error event (OpenAI's error body) and no [DONE]."""

    def sse(chunk) -> str:
        return f"data: {chunk.model_dump_json()}\n\n"

    def echo_chunk(scores) -> str:
        rows = range(len(req.prompts) * req.n)
        echoed = [
            responses.choice(
                i,
                req.prompt_texts[i // req.n],
                responses.logprobs(req, responses.prompt_entries(scores[i // req.n] if scores else None), 0),
            )
            for i in rows
        ]
        return sse(responses.completion(req, model_id, echoed))

    completions = scores = None
    rows = len(req.prompts) * req.n
    # per choice: log-prob entries sent so far, and the text_offset of the next (as responses.logprobs counts it)
    entries_sent, offsets = [0] * rows, [len(req.prompt_texts[i // req.n]) for i in range(rows)]
    try:
        if req.echo and req.logprobs is None:  # at once; with logprobs, once the prompts are scored
            yield echo_chunk(None)
        async for kind, value in job:
            # a turn of the event loop per event: once a write fails, the connection's loss is noticed (and the
            # stream cancelled) before more chunks are written to it, each a "socket.send() raised" warning
            await asyncio.sleep(0)
            if kind == "echo":
                yield echo_chunk(value)
            elif kind == "piece":
                piece, entries = value
                entries = entries or []
                lp = responses.logprobs(req, entries, offsets[piece.index])
                entries_sent[piece.index] += len(entries)
                offsets[piece.index] += sum(len(e["token"]) for e in entries)
                yield sse(responses.completion(req, model_id, [responses.choice(piece.index, piece.text, lp)]))
            elif kind == "done":
                completions, scores = value
            elif kind == "error":
                if not (isinstance(value, Stopped) and value.reason == "cancelled"):
                    error = api_error(value, limits.request_timeout, req.field_of)
                    request.state.error = error.status
                    yield f"data: {error.json().decode()}\n\n"
                return
        tokens = sum(c.completion_tokens for c in completions or [])
        request.state.tokens = tokens
        for c in responses.choices(req, completions, None):
            # the log-probs of tokens no piece covered (text held back, or cut by a stop string)
            left = (completions[c.index].logprobs or [])[entries_sent[c.index] :] if completions else []
            finish = responses.choice(c.index, "", responses.logprobs(req, left, offsets[c.index]), c.finish_reason)
            yield sse(responses.completion(req, model_id, [finish]))
        if req.include_usage:
            yield sse(responses.completion(req, model_id, [], responses.usage(sum(prompt_counts), tokens)))
        yield "data: [DONE]\n\n"
    finally:  # normal end, or the client went away (Starlette cancels this generator): stop the generation
        job.stop()


def _model_card(model, model_id: str) -> dict:
    created = int(model.package.model_file.stat().st_mtime)
    return {
        "id": model_id,
        "object": "model",
        "created": created,
        "owned_by": "edgelm",
        "root": str(model.package.folder),
    }


def _endpoint(handler):
    """`handler`, with any exception it did not expect answered as a 500 in OpenAI's shape (and logged) rather
    than left to Starlette, which would close the connection after answering."""

    @functools.wraps(handler)
    async def endpoint(request):
        try:
            return await handler(request)
        except (ApiError, HTTPException, ClientGone):
            raise
        except Exception as error:
            if not isinstance(error, (EdgelmError, Stopped)):
                log.error("request failed", exc_info=error)
            raise api_error(error, None) from None

    return endpoint


async def _error_response(request, error: ApiError):
    request.state.error = error.status
    return Response(error.json(), error.status, error.headers, media_type="application/json")


async def _http_error(request, error: HTTPException):
    messages = {
        404: f"no such endpoint: {request.method} {request.url.path}",
        405: f"{request.method} is not allowed on {request.url.path}",
    }
    return await _error_response(
        request,
        ApiError(
            error.status_code,
            messages.get(error.status_code, str(error.detail)),
            code="not_found" if error.status_code == 404 else None,
        ),
    )


async def _client_gone(request, error: ClientGone):
    return Response(status_code=499)  # nobody reads it; the log line shows 499


async def _server_error(request, error: Exception):
    log.error("request failed: %s", describe(error))
    return Response(api_error(error).json(), 500, media_type="application/json")
