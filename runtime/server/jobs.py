"""Where requests wait and run: a fair FIFO of slots, then either one running batch or one worker thread each.

    request -> Slots.acquire() (FIFO; 429 when the queue is full; 408 at the deadline)
            -> Job: its Work (start, the Batch's pieces, done) runs in the model's thread: the scheduler's
               running batch (runtime/batching/scheduler.py: continuous batching, CPU with an in-place cache), else a
               worker thread of its own; pieces cross to the event loop through an asyncio.Queue
               (loop.call_soon_threadsafe) -> the response reads them
            -> the job ends (done, error, stopped) -> the slot passes to the oldest waiter

With the scheduler, a slot is a place in the running batch: --max-batch requests decode together, their rows
joining and leaving between steps; a greedy or seeded request still gets what it gets alone (scheduler.py says
where int8 graphs differ). Without it, each request is its own Batch in its own thread (--max-concurrency at
once), and what it gets never depends on what else runs; the Model is shared, read-only and thread-safe.
A job is stopped from outside (client gone, timeout, shutdown) by a flag checked before every forward pass (in
a worker thread) or at every step boundary (in the batch), so a stopped request frees its place within one step.
"""

import asyncio
import logging
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor

from ..errors import EdgelmError

log = logging.getLogger("edgelm.server")


class QueueFull(Exception):
    """Every slot is busy and the waiting line is at its limit."""


class Stopped(Exception):
    """A job was stopped from outside; `reason` says why: "cancelled", "timeout" or "shutdown"."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class Slots:
    """At most `size` jobs at once; waiters are served strictly in arrival order. Event-loop side only.
    Slots made with the same `line` (a list) share one limit: at most `max_queue` waiters in all of them."""

    def __init__(self, size: int, max_queue: int, line: list | None = None):
        self.size, self.max_queue = size, max_queue
        self.active = 0
        self._waiters: deque = deque()
        self.line = [] if line is None else line  # every Slots whose waiters count against max_queue
        self.line.append(self)

    @property
    def queued(self) -> int:
        return sum(not w.done() for w in self._waiters)

    @property
    def waiting(self) -> int:
        """Waiters in every Slots of the line."""
        return sum(slots.queued for slots in self.line)

    async def acquire(self) -> None:
        """Take a slot, waiting in line for one; raises QueueFull when the line is full."""
        if self.active < self.size and not self.queued:
            self.active += 1
            return
        if self.waiting >= self.max_queue:
            raise QueueFull()
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter  # release() hands its slot over by resolving this
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release()  # the slot arrived as we were cancelled: pass it on
            raise

    def release(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot changes hands; `active` stays the same
                return
        self.active -= 1


class Work:
    """What a request runs in the model's thread: start() first, then one piece() per text piece of its Batch
    (`batch`; None when start() does everything), then done(). Each emits the events its response reads."""

    batch = None

    def start(self, job: "Job") -> None:
        pass

    def piece(self, job: "Job", piece) -> None:
        job.emit("piece", piece)

    def done(self, job: "Job") -> None:
        job.emit("done", self.batch.completions)


class Job:
    """One request's Work. Iterate it (on the event loop) for the (kind, value) events the work emits, then
    ("error", exception) if it failed. `on_end` runs on the loop once the job is over. The model's thread calls
    start(), piece() per text piece and finish() (the scheduler's job interface, runtime/batching/scheduler.py), or run()
    does all of it in a worker thread."""

    def __init__(self, work: Work, on_end, deadline: float):
        self.work, self.on_end, self.deadline = work, on_end, deadline
        self.loop = asyncio.get_running_loop()
        self._events: asyncio.Queue = asyncio.Queue()
        self._stop: str | None = None  # set on the loop, read by the model's thread: one attribute, no lock needed
        self._ended = False
        self.outcome = "finished"  # or the reason it was stopped: "cancelled", "timeout", "shutdown"

    # -- the model's thread

    @property
    def batch(self):
        return self.work.batch if self.work is not None else None

    def start(self) -> None:
        self.work.start(self)

    def piece(self, piece) -> None:
        self.work.piece(self, piece)

    def run(self) -> None:
        """The whole work alone, in a worker thread: its Batch decodes on its own decoder."""
        try:
            self.start()
            if self.batch is not None:
                self.batch.engine = self.guard(self.batch.engine)  # every forward pass first checks for a stop
                for piece in self.batch:
                    self.piece(piece)
        except BaseException as error:
            self.finish(error)
        else:
            self.finish(None)

    def finish(self, error: BaseException | None) -> None:
        """The end: done() when nothing failed, else the error as the last event; then the work is let go."""
        try:
            if error is None and self.batch is not None:  # a row that failed alone: this request's answer
                error = self.batch.error
            if error is None:
                self.work.done(self)
        except BaseException as failure:
            error = failure
        try:
            if error is not None:  # every failure reaches the response as a clean error, never a hung client
                if isinstance(error, Stopped):
                    self.outcome = error.reason
                elif not isinstance(error, EdgelmError):
                    log.error("generation failed", exc_info=error)
                self.emit("error", _without_frames(error))
        finally:
            # The work (its Batch, decoder and KV cache) goes now, however the job ended: nothing the response
            # still holds (this job, the error) may keep it alive until a garbage collection.
            self.work = error = None
            self.emit("end")
            self._call(self.on_end, self)

    def emit(self, kind: str, value=None) -> None:
        self._call(self._events.put_nowait, (kind, value))

    def check(self) -> None:
        """Raise Stopped if the request no longer wants tokens; called before every step."""
        if self._stop is None and time.monotonic() > self.deadline:
            self._stop = "timeout"
        if self._stop is not None:
            raise Stopped(self._stop)

    def guard(self, engine) -> "GuardedEngine":
        return GuardedEngine(engine, self)

    def _call(self, function, *args) -> None:
        try:
            self.loop.call_soon_threadsafe(function, *args)
        except RuntimeError:  # the loop is already closed: nobody is listening any more
            pass

    # -- event-loop side

    def stop(self, reason: str = "cancelled") -> None:
        if self._stop is None:
            self._stop = reason

    @property
    def stop_reason(self) -> str | None:
        """Why the job was asked to stop ("cancelled", "timeout", "shutdown"), or None while it is wanted."""
        return self._stop

    def __aiter__(self):
        return self

    async def __anext__(self):
        if not self._ended:
            kind, value = await self._events.get()
            if kind != "end":
                return kind, value
            self._ended = True
        raise StopAsyncIteration


def _without_frames(error: BaseException) -> BaseException:
    """The error with its traceback (and those of its causes) dropped: a traceback holds every frame it passed
    through, the decoder's included, and the error is still referenced after the job has ended."""
    link, seen = error, set()
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        link.__traceback__ = None
        link = link.__cause__ or link.__context__
    return error


class GuardedEngine:
    """The model's engine, handing out decoders that check for a stop before each pass (generation runs every
    pass, the prompt's included, through its decoder)."""

    def __init__(self, engine, job: Job):
        self._engine, self._job = engine, job

    def decoder(self, batch, capacity):
        return GuardedDecoder(self._engine.decoder(batch, capacity), self._job)

    def __getattr__(self, name):
        return getattr(self._engine, name)


class GuardedDecoder:
    """A decoder with the same stop check before each pass: the prompt, then every decode step."""

    def __init__(self, decoder, job: Job):
        self._decoder, self._job = decoder, job

    def run(self, *args):
        self._job.check()
        return self._decoder.run(*args)

    def check(self) -> None:
        """Raise if the job was stopped: a verify pass of several tokens (engine/verify_pass.py) asks first too."""
        self._job.check()

    def __getattr__(self, name):  # the decoder's cache and bindings, for a verify pass over it
        return getattr(self._decoder, name)


class Jobs:
    """The slots, where jobs run (the scheduler's batch, else a pool of worker threads), and every job now
    running (so shutdown can stop them)."""

    def __init__(self, max_concurrency: int, max_queue: int, scheduler=None):
        self.slots = Slots(max_concurrency, max_queue)
        self.scheduler = scheduler
        self.pool = None if scheduler else ThreadPoolExecutor(max_concurrency, thread_name_prefix="edgelm-generate")
        self.running: set = set()
        self.closing = False
        self.ended = {"finished": 0, "cancelled": 0, "timeout": 0, "shutdown": 0}  # jobs by outcome, for /health

    async def start(self, work: Work, deadline: float) -> Job:
        """Wait for a slot (raises QueueFull, or TimeoutError at the deadline), then run `work` in the batch or a thread."""
        if self.closing:
            raise Stopped("shutdown")
        await asyncio.wait_for(self.slots.acquire(), max(deadline - time.monotonic(), 0))
        if self.closing:
            self.slots.release()
            raise Stopped("shutdown")
        job = Job(work, self._ended, deadline)
        self.running.add(job)
        if self.scheduler is not None:
            self.scheduler.submit(job)
        else:
            self.pool.submit(job.run)
        return job

    def _ended(self, job: Job) -> None:
        self.ended[job.outcome] += 1
        self.running.discard(job)
        self.slots.release()

    def stop_all(self, reason: str = "shutdown") -> None:
        self.closing = True
        for job in list(self.running):
            job.stop(reason)

    async def shutdown(self) -> None:
        """Stop every job and wait for them to end (each stops within one step)."""
        self.stop_all("shutdown")
        await asyncio.to_thread(self.scheduler.close if self.scheduler is not None else self.pool.shutdown)
