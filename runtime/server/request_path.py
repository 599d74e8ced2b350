"""One path for every request that runs on the model: read -> parse -> settings -> prepare -> job -> answer/stream.

    body   read_body (JSON only, within --read-timeout and the request's deadline), on the event loop
           then in a worker thread of the server's own (workers.py: counted against --max-queue), nothing of
           it on the event loop:
    parse  parse_json, endpoint.parse(body): the request (shape and the server's limits; ApiError naming the field)
    config endpoint.settings(request): model.settings(**request.options), every option's range checked once
    ready  endpoint.prepare(request, config): prompts rendered and tokenized once, the Batch
    hold   the tokens the rows would hold, against --max-batch-tokens, now that the prompts are counted
    job    admit(): a slot in the FIFO (429 / 408), then GenerationWork runs in the model's thread (jobs.py)
    answer endpoint.answer(request, result) as JSON, or endpoint.writer(request, ready) as server-sent events

Each endpoint (completions.py, chat.py, responses_api.py, score in app.py) writes only its body's parsing, how
its prompts are prepared and its response shapes. Every error a step raises becomes the client's answer through
one mapping (api_errors.api_error), with the request's own field names (`request.field_of`); a stream that fails
after it began ends with the endpoint's error event. However a job ends, its Batch is let go.
"""

import asyncio
import json
import time
from dataclasses import dataclass

from ..errors import EdgelmError
from .api.requests import Limits, ModelNames, check_tokens_held
from .bodies import json_response, parse_json, read_body
from .api_errors import api_error
from .jobs import Stopped, Work
from .waiting import admit, answer_of, event_stream


@dataclass(frozen=True)
class Serving:
    """What every endpoint needs of the server: the model, where its jobs run, the names and limits."""

    model: object
    jobs: object
    names: ModelNames
    limits: Limits
    model_id: str
    workers: object  # workers.Workers: where a request is parsed and prepared
    metrics: object = None  # metrics.Metrics with --metrics, told each generation's figures
    templates: object = None  # template_process.TemplateProcess: where large conversations are rendered


@dataclass
class Ready:
    """A request made ready in the worker thread: its Batch (None: nothing to generate), each prompt's token
    count, and `before`, a function run first in the model's thread (scoring the prompts for echo) whose value
    the job emits as a "before" event and hands on in the Result."""

    batch: object
    prompt_tokens: list
    before: object = None


@dataclass
class Result:
    """What a finished job hands its answer: the completions (None when nothing was generated), the value of
    `before`, and the prompts' token counts."""

    completions: list | None
    before: object
    prompt_tokens: list

    @property
    def tokens(self) -> int:
        return sum(c.completion_tokens for c in self.completions or [])

    @property
    def speculation(self) -> dict | None:
        """{drafted, accepted, acceptance_rate} over the completions that speculated (usage.speculation, an
        extension of edgelm's), or None when none did."""
        rows = [c.speculation for c in self.completions or [] if getattr(c, "speculation", None)]
        if not rows:
            return None
        drafted, accepted = sum(r["drafted"] for r in rows), sum(r["accepted"] for r in rows)
        return {"drafted": drafted, "accepted": accepted, "acceptance_rate": accepted / drafted if drafted else None}


class Endpoint:
    """What an endpoint writes: its parsing, its preparation and its answer's shapes."""

    def __init__(self, serving: Serving):
        self.serving, self.model = serving, serving.model

    def parse(self, body):
        raise NotImplementedError

    def settings(self, request):
        """The request's settings, every option's range checked once; None for a request without runtime options."""
        return None if request.options is None else self.model.settings(**request.options)

    def prepare(self, request, config, deadline: float) -> Ready:
        """In a worker thread: tokenizing must not block the event loop. `config` is None for a request without
        runtime options; `deadline` (time.monotonic()) is when the request runs out of time."""
        raise NotImplementedError

    def answer(self, request, result: Result):
        raise NotImplementedError

    def tokens(self, result: Result) -> int:
        """The tokens the access log shows for this request."""
        return result.tokens

    def writer(self, request, ready: Ready) -> "StreamWriter":
        raise NotImplementedError


class StreamWriter:
    """A streamed answer's text, event by event: what comes before the job's first event, each event's chunks,
    the end once the job is done, and the error event a failed stream ends with."""

    media_type = "text/event-stream"

    def opening(self) -> list:
        return []

    def event(self, kind: str, value) -> list:
        return []

    def closing(self, result: Result) -> list:
        return []

    def error(self, error) -> str:
        return f"data: {error.json().decode()}\n\n"


def route(endpoint: Endpoint):
    """The Starlette handler running `endpoint` through the one path."""

    async def handle(request):
        serving = endpoint.serving
        limits = serving.limits
        deadline = time.monotonic() + limits.request_timeout
        body = await read_body(request, limits, deadline)
        timeout = limits.request_timeout
        req, ready = await serving.workers.run(request, deadline, timeout, _ready, endpoint, body, deadline)
        del body
        check_tokens_held(req, ready.prompt_tokens, limits)
        work = GenerationWork(ready, streamed=req.stream, metrics=serving.metrics, arrived=deadline - limits.request_timeout)
        writer = endpoint.writer(req, ready) if req.stream else None
        del ready  # from here the job holds the Batch, and drops it when it ends
        job = await admit(request, serving.jobs, work, deadline, limits)
        del work
        if req.stream:
            return event_stream(job, _events(request, job, req, writer, limits), writer.media_type)
        result = await answer_of(request, job, limits, req.field_of)
        request.state.tokens = endpoint.tokens(result)
        return json_response(endpoint.answer(req, result))

    return handle


def _ready(endpoint: Endpoint, body: bytes, deadline: float) -> tuple:
    """In a worker thread: the request parsed from its body, its settings built (its constraint compiled) and its
    prompts prepared; an error names the request's own field."""
    req = endpoint.parse(parse_json(body))
    req.body_bytes = len(body)
    try:
        config = endpoint.settings(req)
        return req, endpoint.prepare(req, config, deadline)
    except EdgelmError as error:
        raise api_error(error, field_of=req.field_of) from None


class GenerationWork(Work):
    """One request in the model's thread: `before` (if any), its Batch's pieces as they come (in a stream, each
    with the log-prob entries of the tokens it covers), then the Result."""

    def __init__(self, ready: Ready, streamed: bool, metrics=None, arrived: float | None = None):
        self.batch, self.before, self.prompt_tokens = ready.batch, ready.before, ready.prompt_tokens
        self.streamed, self.before_value = streamed, None
        self.metrics, self.arrived, self.first = metrics, arrived, None  # time.monotonic() of arrival, first piece
        self.sent = [0] * len(self.batch.rows) if self.batch is not None else []  # log-prob entries sent per row

    def start(self, job) -> None:
        if self.before is not None:
            self.before_value = self.before()
            job.emit("before", self.before_value)

    def piece(self, job, piece) -> None:
        if self.first is None:
            self.first = time.monotonic()
        entries = self.batch.rows.logprobs_so_far(piece.index) if self.streamed else None
        if entries is not None:
            entries, self.sent[piece.index] = entries[self.sent[piece.index] :], len(entries)
        job.emit("piece", (piece, entries))

    def done(self, job) -> None:
        completions = self.batch.completions if self.batch is not None else None
        result = Result(completions, self.before_value, self.prompt_tokens)
        if self.metrics is not None and completions is not None:
            self.metrics.generation(
                self.arrived, self.first, time.monotonic(), sum(self.prompt_tokens), result.tokens, result.speculation
            )
        job.emit("done", result)


async def _events(request, job, req, writer: StreamWriter, limits: Limits):
    """Server-sent events: the writer's opening, its chunks for each of the job's events, its closing; a stream
    that fails after it began ends with the writer's error event."""
    result = None
    try:
        for text in writer.opening():
            yield text
        async for kind, value in job:
            # a turn of the event loop per event: once a write fails, the connection's loss is noticed (and the
            # stream cancelled) before more chunks are written to it, each a "socket.send() raised" warning
            await asyncio.sleep(0)
            if kind == "done":
                result = value
            elif kind == "error":
                if not (isinstance(value, Stopped) and value.reason == "cancelled"):
                    error = api_error(value, limits.request_timeout, req.field_of)
                    request.state.error = error.status
                    yield writer.error(error)
                return
            else:
                for text in writer.event(kind, value):
                    yield text
        request.state.tokens = result.tokens
        for text in writer.closing(result):
            yield text
    finally:  # normal end, or the client went away (Starlette cancels this generator): stop the generation
        job.stop()


def sse(body, event: str | None = None) -> str:
    """One server-sent event: a pydantic model or dict as its data line, after an `event:` line if named."""
    data = body.model_dump_json() if hasattr(body, "model_dump_json") else json.dumps(body)
    return (f"event: {event}\n" if event else "") + f"data: {data}\n\n"
