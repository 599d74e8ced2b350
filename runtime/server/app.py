"""The HTTP layer: Starlette routes over one loaded Model, with the middleware of middleware.py around them.

    GET  /health              {"status", "model", "active", "queued", jobs ended so far by outcome ("finished",
                              "cancelled", "timeout", "shutdown"), and "prefix_cache": PrefixCache.stats() or
                              null without one}                                  (no API key needed); while
                              the model loads, 503 {"status": "loading"} (edgelm serve: loading.py)
    GET  /v1/models           the loaded package as the one model (id: the first --model-name, else the package name)
    POST /v1/completions      OpenAI's legacy completions, streaming (server-sent events) or not; prompts as
                              text or token ids
    POST /v1/chat/completions OpenAI's chat completions, the prompt made by the package's chat template (chat.py);
                              tools and tool calls, response_format (structured output)
    POST /v1/responses        OpenAI's Responses API, stateless, on the chat path (responses_api.py)
    POST /v1/score            {"text"} -> per-token log-probs and perplexity (Model.score)
    POST /tokenize            {"content", "add_special"?} -> {"tokens": [ids]}      (llama-server's shapes)
    POST /detokenize          {"tokens": [ids]} -> {"content"}
    GET  /metrics             Prometheus' text format, with metrics=True (edgelm serve --metrics; metrics.py)
    GET/POST /api/...         Ollama's API: version, tags, ps, show, chat, generate (api/ollama.py)

Every request that runs on the model takes the one path of request_path.py: read (JSON only, within
--read-timeout), then parsed, its settings built once (Model.settings) and prepared in a worker thread, then it waits
for a slot and runs as a Job (jobs.py). A non-streaming request that loses its client, or a stream whose
client goes away, stops its job at once; the job then drops its Batch, whatever ended it. Every error a request causes is answered in OpenAI's error shape on a connection
that stays usable; only a body that never arrives closes it.
"""

import asyncio
import functools
import gc
import logging
import threading
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.responses import Response
from starlette.routing import Route

from ..batching.scheduler import Scheduler
from ..engine import native
from ..errors import EdgelmError
from .api import completion_answers, ollama, requests
from .api.chat import Chat
from .api.completions import Completions
from .api.requests import Limits, ModelNames
from .api.responses_api import Responses
from .bodies import json_response, parse_json, read_body
from .api_errors import ApiError, api_error, describe
from .jobs import Jobs, Stopped
from .middleware import AccessLog, ApiKey, HostCheck, cors
from .request_path import Endpoint, Ready, Serving, route
from .template_process import TemplateProcess
from .text_work import TextWork
from .waiting import ClientGone
from .workers import Workers

log = logging.getLogger("edgelm.server")
# Threads that parse and prepare requests (request_path.py): a compile or a render holds one; more would only share the
# same cores, and each thread's malloc arena keeps what its work freed.
PREPARE_THREADS = 2


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
    metrics: bool = False,
    prepare_constraints: bool = True,
):
    """The ASGI application serving `model` (a runtime Model, loaded once) on `host` (for the Host check).
    Requests may name it by the package's name or any of `model_names` (the first is the id it is listed as),
    or by any name with `accept_any_model`. Its `jobs` are the slots and where they run: one running batch of
    up to `max_batch` rows (continuous batching) where the model's decoders write their cache in place and
    max_batch > 0, else `max_concurrency` worker threads, a request each. With `prepare_constraints`, what every
    constraint needs (llguidance's table of the tokenizer) is built in the background as the server starts."""
    jobs = jobs_for(model, max_batch, max_concurrency, max_queue)
    names = model_names_for(model, model_names, accept_any_model)
    model_id = names.id
    workers = Workers("prepare", PREPARE_THREADS, max_queue, jobs.slots.line)
    prefix_cache = model.engine.prefix_cache
    counters = None
    if metrics:  # prometheus_client only when asked for
        from .metrics import Metrics

        counters = Metrics(jobs, prefix_cache)
    templates = TemplateProcess(model.chat_template)  # started by the first large conversation, if one comes
    serving = Serving(model, jobs, names, limits, model_id, workers, counters, templates)

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

    text_work = TextWork(model, limits, max_queue, jobs.slots.line)

    async def tokenize(request):
        return Response(await text_work.tokens(request), media_type="application/json")

    async def detokenize(request):
        return Response(await text_work.text(request), media_type="application/json")

    def stop_all() -> None:
        """Shutting down: every request still waiting, being prepared, tokenized or generated gets its answer now."""
        jobs.stop_all("shutdown")
        workers.stop_all()
        text_work.workers.stop_all()

    def start() -> None:
        """Once, as the server starts to serve (its lifespan; under edgelm serve, loading.Gate.open, the lifespan
        having run before the model was loaded)."""
        if app.started:
            return
        app.started = True
        # What is alive at the start (the model, its tokenizer and template, every module) stays alive while the
        # server runs: frozen out of the garbage collector's sight, a full collection walks only what requests
        # built, and holds the GIL (the event loop waits) that much shorter while a large body's objects are made.
        gc.collect()
        gc.freeze()
        native.bound_freed_heap()  # what a burst of heavy requests frees goes back to the system
        if prepare_constraints:  # in the background: the server answers meanwhile
            threading.Thread(target=_prepare_constraints, args=(model,), name="edgelm-constraints", daemon=True).start()

    @asynccontextmanager
    async def lifespan(app):
        start()
        try:
            yield
        finally:
            gc.unfreeze()
        workers.close()
        text_work.close()
        templates.close()
        await jobs.shutdown()

    async def ollama_version(request):
        return json_response(ollama.version())

    async def ollama_tags(request):
        return json_response({"models": [ollama.model_entry(model, model_id)]})

    async def ollama_ps(request):
        return json_response({"models": [ollama.model_entry(model, model_id) | {"size_vram": 0, "expires_at": None}]})

    async def ollama_show(request):
        deadline = time.monotonic() + limits.request_timeout
        raw = await read_body(request, limits, deadline)
        body = await workers.run(request, deadline, limits.request_timeout, parse_json, raw)  # off the event loop
        if isinstance(body, dict):
            names.check(body.get("model", body.get("name")))
        return json_response(ollama.show(model, model_id, body))

    async def metrics_text(request):
        body, media_type = counters.exposition()
        return Response(body, media_type=media_type)

    routes = [
        Route("/health", _endpoint(health)),
        *([Route("/metrics", _endpoint(metrics_text))] if counters is not None else []),
        Route("/api/version", _ollama(ollama_version)),
        Route("/api/tags", _ollama(ollama_tags)),
        Route("/api/ps", _ollama(ollama_ps)),
        Route("/api/show", _ollama(ollama_show), methods=["POST"]),
        Route("/api/chat", _ollama(route(ollama.OllamaChat(serving))), methods=["POST"]),
        Route("/api/generate", _ollama(route(ollama.OllamaChat(serving, generate=True))), methods=["POST"]),
        Route("/v1/models", _endpoint(models)),
        Route("/v1/models/{name:path}", _endpoint(one_model)),
        Route("/v1/completions", _endpoint(route(Completions(serving))), methods=["POST"]),
        Route("/v1/chat/completions", _endpoint(route(Chat(serving))), methods=["POST"]),
        Route("/v1/responses", _endpoint(route(Responses(serving))), methods=["POST"]),
        Route("/v1/score", _endpoint(route(Score(serving))), methods=["POST"]),
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
    paths = tuple(r.path for r in routes if "{" not in r.path)
    app = AccessLog(HostCheck(cors(inner, tuple(allow_origins)), host, tuple(allow_hosts)), counters, paths)
    app.jobs, app.limits, app.names, app.model = jobs, limits, names, model
    app.workers, app.text_work, app.stop_all, app.templates = workers, text_work, stop_all, templates
    app.start, app.started = start, False
    return app


def _prepare_constraints(model) -> None:
    """Build llguidance's table of the model's tokenizer (sampling/token_bytes.py), which every constraint needs and
    which is built once for the process's life, so that the first constrained request does not wait for it, and the
    server's idle memory is what it will be once it serves structured output."""
    try:
        model.prepare_constraints()
    except EdgelmError as error:  # llguidance missing, or a tokenizer it cannot read: each constrained request says so
        log.info("constrained generation unavailable: %s", error)
    except Exception as error:  # a package's files that fail otherwise: the first constrained request tries again
        log.warning("the constraint table could not be built as the server started: %s", error)


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


@dataclass(kw_only=True)
class ScoreRequest:
    """One parsed /v1/score body: its text; no runtime options, no stream."""

    text: str
    options = None
    stream = False
    n = 1
    max_tokens = 0

    def field_of(self, option: str | None) -> str:
        return "text"  # the text is all a score request sends

    def tokens_held(self, prompt_tokens: list) -> int:
        return 0  # Model.score bounds the text by the model's context


class Score(Endpoint):
    """POST /v1/score: the text's per-token log-probs and perplexity (Model.score), in the model's thread."""

    def parse(self, body) -> ScoreRequest:
        return ScoreRequest(text=requests.parse_score_request(body, self.serving.names))

    def prepare(self, req: ScoreRequest, config, deadline: float) -> Ready:
        return Ready(None, [], lambda: self.model.score(req.text))

    def answer(self, req: ScoreRequest, result):
        return completion_answers.score(result.before, self.serving.model_id)

    def tokens(self, result) -> int:
        return len(result.before.token_ids)


def _model_card(model, model_id: str) -> dict:
    created = int(model.package.model_file.stat().st_mtime)
    return {
        "id": model_id,
        "object": "model",
        "created": created,
        "owned_by": "edgelm",
        "root": model.package.name,  # the package's name, never where the server keeps it
    }


def _endpoint(handler):
    """`handler`, with any exception it did not expect answered as a 500 in OpenAI's shape (and logged) rather
    than left to Starlette, which would close the connection after answering; one cancelled as the server stops
    answered 503 (rather than uvicorn's plain-text 500 and a traceback in the log)."""

    @functools.wraps(handler)
    async def endpoint(request):
        try:
            return await handler(request)
        except asyncio.CancelledError:  # uvicorn's backstop, past --shutdown-timeout + 5 s into a shutdown
            request.state.error = 503
            return Response(api_error(Stopped("shutdown")).json(), 503, media_type="application/json")
        except (ApiError, HTTPException, ClientGone):
            raise
        except Exception as error:
            if not isinstance(error, (EdgelmError, Stopped)):
                log.error("request failed", exc_info=error)
            raise api_error(error, None) from None

    return endpoint


def _ollama(handler):
    """An Ollama route: `handler` through _endpoint, its errors answered in Ollama's shape ({"error": message})."""
    inner = _endpoint(handler)

    @functools.wraps(handler)
    async def endpoint(request):
        try:
            return await inner(request)
        except ApiError as error:
            request.state.error = error.status
            return ollama.ollama_error(error)

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
