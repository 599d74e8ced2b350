"""The HTTP layer: Starlette routes over one loaded Model, an API-key check and a one-line-per-request log.

    GET  /health              {"status", "model", "active", "queued", and jobs ended so far by outcome:
                              "finished", "cancelled", "timeout", "shutdown"}    (no API key needed)
    GET  /v1/models           the loaded package as the one model (id = package name)
    POST /v1/completions      OpenAI's legacy completions, streaming (server-sent events) or not
    POST /v1/score            {"text"} -> per-token log-probs and perplexity (Model.score)

A completion request is parsed (schema.py), tokenized, then waits for a slot and runs as a Job (jobs.py).
A non-streaming request that loses its client, or a stream whose client goes away, stops its job at once.
"""

import asyncio
import json
import logging
import signal
import time
from contextlib import asynccontextmanager

import uvicorn
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..errors import GenerationOptionError, PromptError
from . import schema
from .jobs import Job, Jobs, QueueFull, Stopped
from .middleware import AccessLog, ApiKey
from .schema import ApiError, Limits

log = logging.getLogger("edgelm.server")
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class ClientGone(Exception):
    """The client closed its connection before the answer was ready."""


def create_app(
    model, limits: Limits = Limits(), max_concurrency: int = 2, max_queue: int = 64, api_key: str | None = None
):
    """The ASGI application serving `model` (a runtime Model, loaded once). Its `jobs` are the slots and workers."""
    jobs = Jobs(max_concurrency, max_queue)
    model_id = model.package.name

    async def health(request):
        return JSONResponse(
            {"status": "ok", "model": model_id, "active": jobs.slots.active, "queued": jobs.slots.queued, **jobs.ended}
        )

    async def models(request):
        return JSONResponse({"object": "list", "data": [_model_card(model)]})

    async def one_model(request):
        if request.path_params["name"] != model_id:
            raise ApiError(
                404,
                f"the model {request.path_params['name']!r} does not exist here; this server runs {model_id!r}",
                "model",
                "model_not_found",
            )
        return JSONResponse(_model_card(model))

    async def completions(request):
        deadline = time.monotonic() + limits.request_timeout
        req = schema.parse_completion_request(await _read_json(request, limits.max_body_bytes), model, limits)
        generation, prompt_counts = await _runtime_errors(asyncio.to_thread(_prepare, model, req))
        job = await _admit(request, jobs, lambda job: _complete(model, req, generation, job), deadline, limits)
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
        except Exception as error:
            raise _api_error(error, limits) from None
        tokens = sum(c.completion_tokens for c in completions or [])
        request.state.tokens = tokens
        return JSONResponse(
            schema.completion(
                req, model_id, schema.choices(req, completions, scores), schema.usage(sum(prompt_counts), tokens)
            )
        )

    async def score(request):
        text = schema.parse_score_request(await _read_json(request, limits.max_body_bytes), model_id)
        job = await _admit(
            request,
            jobs,
            lambda job: job.emit("done", model.score(text)),
            time.monotonic() + limits.request_timeout,
            limits,
        )
        try:
            result = await _unless_gone(request, _result(job), job)
        except PromptError as error:
            raise ApiError(400, str(error), "text", "invalid_prompt") from None
        except Exception as error:
            raise _api_error(error, limits) from None
        request.state.tokens = len(result.token_ids)
        return JSONResponse(schema.score(result, model_id))

    @asynccontextmanager
    async def lifespan(app):
        yield
        await jobs.shutdown()

    routes = [
        Route("/health", health),
        Route("/v1/models", models),
        Route("/v1/models/{name:path}", one_model),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/score", score, methods=["POST"]),
    ]
    handlers = {
        ApiError: _error_response,
        HTTPException: _http_error,
        ClientGone: _client_gone,
        Exception: _server_error,
    }
    app = AccessLog(ApiKey(Starlette(routes=routes, exception_handlers=handlers, lifespan=lifespan), api_key))
    app.jobs = jobs
    return app


def run(app, host: str, port: int, log_level: str = "info", shutdown_timeout: float = 5.0) -> None:
    """Serve `app` with uvicorn until SIGINT/SIGTERM; a requested shutdown returns normally (exit code 0)."""
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        access_log=False,
        log_config=None,
        log_level=log_level,
        timeout_graceful_shutdown=shutdown_timeout + 5,
    )  # a backstop: GracefulServer stops jobs first
    # uvicorn re-raises the signal after its clean shutdown, which would kill the process with it;
    # handlers that do nothing make that a normal return.
    previous = {s: signal.signal(s, lambda *_: None) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        GracefulServer(config, app.jobs, shutdown_timeout).run()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


class GracefulServer(uvicorn.Server):
    """uvicorn's server, stopping the generations still running `grace` seconds into a shutdown, so that
    their clients get a clean 503 or a final error event rather than a cut connection."""

    def __init__(self, config, jobs: Jobs, grace: float):
        super().__init__(config)
        self.jobs, self.grace = jobs, grace

    async def shutdown(self, sockets=None):
        asyncio.get_running_loop().call_later(self.grace, self.jobs.stop_all, "shutdown")
        await super().shutdown(sockets)


def _prepare(model, req) -> tuple:
    """Tokenize and check the prompts (worker thread: a long prompt must not block the event loop)."""
    if req.max_tokens == 0:  # echo only: nothing to generate
        return None, [max(len(model.encode(p)), 1) for p in req.prompts]
    generation = model.batch(req.prompts, **req.options)
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


async def _events(request, job, req, model_id, prompt_counts, limits):
    """Server-sent events: text pieces as they become final, a finish chunk per choice, usage if asked, [DONE].
    A stream that fails after it began ends with an error event (OpenAI's error body) and no [DONE]."""

    def sse(body) -> str:
        return f"data: {json.dumps(body, ensure_ascii=False, allow_nan=False, separators=(',', ':'))}\n\n"

    completions = scores = None
    try:
        if req.echo:
            yield sse(
                schema.completion(
                    req, model_id, [schema.choice(i, req.prompts[i // req.n]) for i in range(len(req.prompts) * req.n)]
                )
            )
        async for kind, value in job:
            if kind == "piece":
                yield sse(schema.completion(req, model_id, [schema.choice(value.index, value.text)]))
            elif kind == "done":
                completions, scores = value
            elif kind == "error":
                if not (isinstance(value, Stopped) and value.reason == "cancelled"):
                    error = _api_error(value, limits)
                    request.state.error = error.status
                    yield sse(error.body())
                return
        tokens = sum(c.completion_tokens for c in completions or [])
        request.state.tokens = tokens
        for c in schema.choices(req, completions, scores):
            yield sse(
                schema.completion(req, model_id, [schema.choice(c["index"], "", c["logprobs"], c["finish_reason"])])
            )
        if req.include_usage:
            yield sse(schema.completion(req, model_id, [], schema.usage(sum(prompt_counts), tokens)))
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
        ) from None
    except asyncio.TimeoutError:
        raise _api_error(Stopped("timeout"), limits) from None
    except Stopped as stopped:
        raise _api_error(stopped, limits) from None


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


async def _runtime_errors(awaitable):
    try:
        return await awaitable
    except (PromptError, GenerationOptionError) as error:
        raise _api_error(error, None) from None


def _api_error(error: Exception, limits: Limits | None) -> ApiError:
    """Map what a job or the runtime raised to the error the client gets."""
    if isinstance(error, ApiError):
        return error
    if isinstance(error, PromptError):
        return ApiError(400, str(error), "prompt", "invalid_prompt")
    if isinstance(error, GenerationOptionError):
        return ApiError(400, str(error), schema.param_of(str(error), {}))
    if isinstance(error, Stopped) and error.reason == "timeout":
        limit = f"{limits.request_timeout:g} s " if limits else ""
        return ApiError(
            408,
            f"the request ran longer than {limit}(--request-timeout), waiting included; ask for fewer tokens or retry later",
            code="request_timeout",
            type="timeout_error",
        )
    if isinstance(error, Stopped):
        return ApiError(
            503, "the server is shutting down; retry in a moment", code="server_shutdown", type="server_error"
        )
    log.error("generation failed", exc_info=error)
    return ApiError(500, f"the server failed on this request: {type(error).__name__}: {error}", type="server_error")


async def _read_json(request, limit: int):
    """The body as JSON, refused with 413 past `limit` bytes (Content-Length first, then as it arrives)."""
    declared = request.headers.get("content-length", "")
    too_large = ApiError(413, f"the request body is over {limit} bytes (--max-body-bytes)", code="request_too_large")
    if declared.isdigit() and int(declared) > limit:
        raise too_large
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise too_large
    try:
        return json.loads(body, parse_constant=_no_constants)
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


async def _error_response(request, error: ApiError):
    request.state.error = error.status
    return JSONResponse(error.body(), status_code=error.status)


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
    return JSONResponse(_api_error(error, None).body(), status_code=500)
