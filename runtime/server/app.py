"""The HTTP layer: Starlette routes over one loaded Model, with the middleware of middleware.py around them.

    GET  /health              {"status", "model", "active", "queued", and jobs ended so far by outcome:
                              "finished", "cancelled", "timeout", "shutdown"}    (no API key needed)
    GET  /v1/models           the loaded package as the one model (id = package name)
    POST /v1/completions      OpenAI's legacy completions, streaming (server-sent events) or not
    POST /v1/score            {"text"} -> per-token log-probs and perplexity (Model.score)

A completion request is read (JSON only, within --read-timeout), parsed (requests.py), its settings built
once (Model.settings), tokenized, then waits for a slot and runs as a Job (jobs.py). A non-streaming request
that loses its client, or a stream whose client goes away, stops its job at once; the job then drops its
Batch, whatever ended it. Every error a request causes is answered in OpenAI's error shape on a connection
that stays usable; only a body that never arrives closes it.
"""

import asyncio
import functools
import json
import logging
import time
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from ..errors import EdgelmError
from . import requests, responses
from .errors import ApiError, api_error, describe
from .jobs import Job, Jobs, QueueFull, Stopped
from .middleware import AccessLog, ApiKey, HostCheck, cors
from .requests import Limits

log = logging.getLogger("edgelm.server")
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
RETRY_AFTER = "1"  # seconds a client refused with 429 should wait before trying again


class ClientGone(Exception):
    """The client closed its connection before the answer was ready."""


def create_app(
    model,
    limits: Limits = Limits(),
    max_concurrency: int = 2,
    max_queue: int = 64,
    api_key: str | None = None,
    host: str = "127.0.0.1",
    allow_hosts: tuple = (),
    allow_origins: tuple = (),
):
    """The ASGI application serving `model` (a runtime Model, loaded once) on `host` (for the Host check).
    Its `jobs` are the slots and workers."""
    jobs = Jobs(max_concurrency, max_queue)
    model_id = model.package.name

    async def health(request):
        return _json(
            {"status": "ok", "model": model_id, "active": jobs.slots.active, "queued": jobs.slots.queued, **jobs.ended}
        )

    async def models(request):
        return _json({"object": "list", "data": [_model_card(model)]})

    async def one_model(request):
        if request.path_params["name"] != model_id:
            raise ApiError(
                404,
                f"the model {request.path_params['name'][:100]!r} does not exist here; this server runs {model_id!r}",
                "model",
                "model_not_found",
            )
        return _json(_model_card(model))

    async def completions(request):
        deadline = time.monotonic() + limits.request_timeout
        body = await read_json(request, limits, deadline)
        req = requests.parse_completion_request(body, model_id, model.arch.vocab_size, limits)
        try:
            config = model.settings(**req.options)  # every option's range, checked once
        except EdgelmError as error:
            raise api_error(error, field_of=req.field_of) from None
        generation, prompt_counts = await _runtime_errors(asyncio.to_thread(_prepare, model, req, config), req)
        requests.check_tokens_held(req, prompt_counts, limits)
        work = functools.partial(_complete, model, req, generation)
        del generation  # from here the job holds it, and drops it when it ends
        job = await _admit(request, jobs, work, deadline, limits)
        del work
        if req.stream:
            # background: a stream cut before its generator ever ran has no `finally` to stop the job
            return StreamingResponse(
                _events(request, job, req, model_id, prompt_counts, limits),
                media_type="text/event-stream",
                headers=SSE_HEADERS,
                background=BackgroundTask(job.stop),
            )
        try:
            completions, scores = await _unless_gone(request, _result(job), job)
        except (ClientGone, ApiError):
            raise
        except Exception as error:
            raise api_error(error, limits.request_timeout, req.field_of) from None
        tokens = sum(c.completion_tokens for c in completions or [])
        request.state.tokens = tokens
        return _json(
            responses.completion(
                req, model_id, responses.choices(req, completions, scores), responses.usage(sum(prompt_counts), tokens)
            )
        )

    async def score(request):
        deadline = time.monotonic() + limits.request_timeout
        text = requests.parse_score_request(await read_json(request, limits, deadline), model_id)
        job = await _admit(request, jobs, functools.partial(_score, model, text), deadline, limits)
        try:
            result = await _unless_gone(request, _result(job), job)
        except ClientGone:
            raise
        except EdgelmError as error:
            error = api_error(error)
            raise ApiError(error.status, error.message, "text", error.code) from None
        except Exception as error:
            raise api_error(error, limits.request_timeout) from None
        request.state.tokens = len(result.token_ids)
        return _json(responses.score(result, model_id))

    @asynccontextmanager
    async def lifespan(app):
        yield
        await jobs.shutdown()

    routes = [
        Route("/health", _endpoint(health)),
        Route("/v1/models", _endpoint(models)),
        Route("/v1/models/{name:path}", _endpoint(one_model)),
        Route("/v1/completions", _endpoint(completions), methods=["POST"]),
        Route("/v1/score", _endpoint(score), methods=["POST"]),
    ]
    handlers = {
        ApiError: _error_response,
        HTTPException: _http_error,
        ClientGone: _client_gone,
        Exception: _server_error,
    }
    inner = ApiKey(Starlette(routes=routes, exception_handlers=handlers, lifespan=lifespan), api_key)
    app = AccessLog(HostCheck(cors(inner, tuple(allow_origins)), host, tuple(allow_hosts)))
    app.jobs, app.limits = jobs, limits
    return app


def _prepare(model, req, config) -> tuple:
    """Tokenize and check the prompts (worker thread: a long prompt must not block the event loop)."""
    if req.max_tokens == 0:  # echo only: nothing to generate
        return None, [max(len(model.encode(p)), 1) for p in req.prompts]
    generation = model.batch(req.prompts, config=config)
    return generation, [len(ids) for ids in generation.prompts]


def _complete(model, req, generation, job) -> None:
    """The worker thread's part of one completion request: pieces as they come, then the completions."""
    scores = [model.score(p) if p else None for p in req.prompts] if req.echo and req.logprobs is not None else None
    completions = None
    if generation is not None:
        generation.engine = job.guard(generation.engine)  # every forward pass first checks for a stop
        for piece in generation:
            job.emit("piece", piece)
        completions = generation.completions
    job.emit("done", (completions, scores))


def _score(model, text, job) -> None:
    job.emit("done", model.score(text))


async def _events(request, job, req, model_id, prompt_counts, limits):
    """Server-sent events: text pieces as they become final, a finish chunk per choice, usage if asked, [DONE].
    A stream that fails after it began ends with an error event (OpenAI's error body) and no [DONE]."""

    def sse(chunk) -> str:
        return f"data: {chunk.model_dump_json()}\n\n"

    completions = scores = None
    try:
        if req.echo:
            echoed = [responses.choice(i, req.prompts[i // req.n]) for i in range(len(req.prompts) * req.n)]
            yield sse(responses.completion(req, model_id, echoed))
        async for kind, value in job:
            if kind == "piece":
                yield sse(responses.completion(req, model_id, [responses.choice(value.index, value.text)]))
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
        for c in responses.choices(req, completions, scores):
            finish = responses.choice(c.index, "", c.logprobs, c.finish_reason)
            yield sse(responses.completion(req, model_id, [finish]))
        if req.include_usage:
            yield sse(responses.completion(req, model_id, [], responses.usage(sum(prompt_counts), tokens)))
        yield "data: [DONE]\n\n"
    finally:  # normal end, or the client went away (Starlette cancels this generator): stop the generation
        job.stop()


async def _admit(request, jobs, work, deadline, limits):
    """Wait in line for a slot and start `work` on it; refuse with 429 when the line is full, 408 at the deadline."""
    try:
        return await _unless_gone(request, jobs.start(work, deadline))
    except QueueFull:
        raise ApiError(
            429,
            f"the server is busy: {jobs.slots.size} requests are running and {jobs.slots.max_queue} waiting (--max-queue); retry shortly",
            code="queue_full",
            type="rate_limit_error",
            headers={"Retry-After": RETRY_AFTER},
        ) from None
    except asyncio.TimeoutError:
        raise api_error(Stopped("timeout"), limits.request_timeout) from None
    except Stopped as stopped:
        raise api_error(stopped, limits.request_timeout) from None


async def _result(job):
    """The value of a job's "done" event; its error re-raised."""
    async for kind, value in job:
        if kind == "done":
            return value
        if kind == "error":
            raise value
    raise Stopped("cancelled")


async def _unless_gone(request, awaitable, job=None):
    """Await `awaitable` unless the client disconnects first: then cancel it, stop the job, raise ClientGone."""
    task = asyncio.ensure_future(awaitable)
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not task.done():
            task.cancel()
            task.add_done_callback(_stop_late_job)
            if job is not None:
                job.stop()
    if task.done() and not task.cancelled():
        return task.result()
    request.state.error = 499  # nginx's "client closed request", for the log line only
    raise ClientGone()


def _stop_late_job(task) -> None:
    """A job that started just as its client left has nobody to answer: stop it (and read the task's outcome)."""
    if not task.cancelled() and task.exception() is None and isinstance(task.result(), Job):
        task.result().stop()


async def _disconnected(request) -> None:
    """Returns when the client closes the connection (the body has been read, so only that can arrive)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _runtime_errors(awaitable, req):
    try:
        return await awaitable
    except EdgelmError as error:
        raise api_error(error, field_of=req.field_of) from None


async def read_json(request, limits: Limits, deadline: float):
    """The body as JSON. Refused: a content type other than application/json (415: a web page cannot send
    that without the browser asking first), past --max-body-bytes (413), not complete within --read-timeout
    or the request's deadline (408, and the connection is closed), not JSON (400)."""
    media_type, _, parameters = request.headers.get("content-type", "").partition(";")
    charset = parameters.strip().lower().replace(" ", "")
    if media_type.strip().lower() != "application/json" or charset not in ("", "charset=utf-8", "charset=\"utf-8\""):
        raise ApiError(
            415,
            "the request body must be JSON, sent with the header 'Content-Type: application/json'",
            code="unsupported_media_type",
        )
    declared = request.headers.get("content-length", "")
    too_large = ApiError(
        413, f"the request body is over {limits.max_body_bytes} bytes (--max-body-bytes)", code="request_too_large"
    )
    if declared.isdigit() and int(declared) > limits.max_body_bytes:
        raise too_large

    async def read() -> bytes:
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > limits.max_body_bytes:
                raise too_large
        return bytes(body)

    wait = min(limits.read_timeout, deadline - time.monotonic())
    try:
        body = await asyncio.wait_for(read(), max(wait, 0))
    except asyncio.TimeoutError:
        raise ApiError(
            408,
            f"the request body did not arrive within {wait:g} s (--read-timeout)",
            code="request_timeout",
            type="timeout_error",
            headers={"Connection": "close"},
        ) from None
    try:
        return json.loads(body, parse_constant=_no_constants)
    except RecursionError:
        raise ApiError(400, "the request body is nested too deeply to be a request", code="invalid_json") from None
    except ValueError as error:  # JSONDecodeError and UnicodeDecodeError are both ValueErrors
        raise ApiError(400, f"the request body is not valid JSON: {error}", code="invalid_json") from None


def _no_constants(name: str):
    raise ValueError(f"{name} is not a JSON number")


def _model_card(model) -> dict:
    created = int(model.package.model_file.stat().st_mtime)
    return {
        "id": model.package.name,
        "object": "model",
        "created": created,
        "owned_by": "edgelm",
        "root": str(model.package.folder),
    }


def _json(body, status: int = 200, headers: dict | None = None) -> Response:
    """A JSON response from a dict (ASCII JSON) or a pydantic model."""
    content = body.model_dump_json() if hasattr(body, "model_dump_json") else json.dumps(body)
    return Response(content, status, headers, media_type="application/json")


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
