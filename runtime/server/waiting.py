"""What every generation request does around its job: wait in line for a slot, watch for the client leaving,
and turn what the runtime or the queue raised into the error the client gets. Shared by the completions and
chat endpoints."""

import asyncio

from starlette.background import BackgroundTask
from starlette.responses import StreamingResponse

from .api_errors import ApiError, api_error
from .jobs import Job, QueueFull, Stopped

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
RETRY_AFTER = "1"  # seconds a client refused with 429 should wait before trying again


class ClientGone(Exception):
    """The client closed its connection before the answer was ready."""


async def admit(request, jobs, work, deadline, limits):
    """Wait in line for a slot and start `work` on it; refuse with 429 when the line is full, 408 at the deadline."""
    try:
        return await unless_gone(request, jobs.start(work, deadline))
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


def event_stream(job, events, media_type: str = "text/event-stream") -> StreamingResponse:
    """A job's answer as server-sent events (or Ollama's JSON lines). The background task stops the job: a stream
    cut before its generator ever ran has no `finally` to do it."""
    return StreamingResponse(events, media_type=media_type, headers=SSE_HEADERS, background=BackgroundTask(job.stop))


async def answer_of(request, job, limits, field_of=None):
    """The job's result, or the error the client gets: ClientGone when it left, else OpenAI's error body."""
    try:
        return await unless_gone(request, job_result(job), job)
    except (ClientGone, ApiError):
        raise
    except Exception as error:
        raise api_error(error, limits.request_timeout, field_of) from None


async def job_result(job):
    """The value of a job's "done" event; its error re-raised."""
    async for kind, value in job:
        if kind == "done":
            return value
        if kind == "error":
            raise value
    raise Stopped("cancelled")


async def unless_gone(request, awaitable, job=None):
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
