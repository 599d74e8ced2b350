"""Worker threads of the server's own, for what a request does off the event loop before (or instead of) a job:
parsing its body, building its settings (compiling its constraint), rendering and tokenizing its prompts
(request_path.py), and the tokenizer's work of /tokenize and /detokenize (text_work.py).

    request -> Workers.run(): a place in line (FIFO; counted against --max-queue with the requests waiting for
               a slot: 429 past it, 408 at the deadline) -> the call, in one of the pool's threads -> its value

A client that leaves while its request waits in line frees its place and its call never starts; one that leaves
while its call runs gets no answer (ClientGone at once), and its place is held until the call ends (a call in a
thread cannot be interrupted: at most one call per thread outlives its client), so abandoned work never piles up
behind the threads. When the server stops (stop_all, --shutdown-timeout into a shutdown), every request still
waiting or running here is answered 503. A call that fails hands its freed heap back to the system (a failed
constraint compile can leave hundreds of MB freed but resident in the thread's malloc arena), and its error
crosses to the loop without its traceback (whose frames would hold what the call built until it is collected).
"""

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

from ..engine.session import release_freed_memory
from .api_errors import ApiError, api_error
from .jobs import QueueFull, Slots, Stopped, _without_frames
from .waiting import RETRY_AFTER, ClientGone, unless_gone


class Workers:
    """`threads` worker threads and their line, whose waiters count in `line` (jobs.Slots' shared limit)."""

    def __init__(self, name: str, threads: int, max_queue: int, line: list):
        self.slots = Slots(threads, max_queue, line)
        self.executor = ThreadPoolExecutor(threads, thread_name_prefix=f"edgelm-{name}")
        self.closing = False
        self.stopping = asyncio.Event()  # set on the loop by stop_all

    async def run(self, request, deadline: float, request_timeout: float, function, *args):
        """function(*args) in a worker thread, once a thread is free: its value, or its error re-raised.
        Raises ApiError 429 (the line is full), 408 (the deadline came first), 503 (shutting down), or ClientGone."""
        if await request.is_disconnected():  # the client sent its body and left at once: nothing to start
            request.state.error = 499
            raise ClientGone()
        work = self._in_line(deadline, request_timeout, function, args)
        return await unless_gone(request, self._unless_stopped(work))

    async def _in_line(self, deadline: float, request_timeout: float, function, args):
        if self.closing:
            raise api_error(Stopped("shutdown"))
        await self._place(deadline, request_timeout)
        # From here to the submission nothing awaits: a place taken is always a call submitted, or given back.
        loop = asyncio.get_running_loop()
        try:
            future = self.executor.submit(_call, function, args)
        except RuntimeError:  # the executor is shut down: the server is stopping
            self.slots.release()
            raise api_error(Stopped("shutdown")) from None
        future.add_done_callback(lambda _: _on_loop(loop, self.slots.release))  # the call's end frees its place
        return await asyncio.wrap_future(future)  # cancelled (client gone, shutdown): a call not begun never runs

    async def _place(self, deadline: float, request_timeout: float) -> None:
        """Take a place, waiting in line for one until the deadline; a place that arrives as the wait is given up
        (cancelled, timed out) is passed on."""
        slots = self.slots
        if slots.active < slots.size and not slots.queued:
            return await slots.acquire()  # a free place, taken at once: nothing to give up
        acquire = asyncio.ensure_future(slots.acquire())
        try:
            await asyncio.wait_for(asyncio.shield(acquire), max(deadline - time.monotonic(), 0))
        except QueueFull:
            raise queue_full(slots) from None
        except asyncio.TimeoutError:
            self._give_up(acquire)
            raise api_error(Stopped("timeout"), request_timeout) from None
        except asyncio.CancelledError:
            self._give_up(acquire)
            raise

    def _give_up(self, acquire) -> None:
        if not acquire.done():
            acquire.cancel()  # Slots.acquire passes on a place that arrives as it is cancelled
        elif not acquire.cancelled() and acquire.exception() is None:
            self.slots.release()

    async def _unless_stopped(self, awaitable):
        """Await `awaitable` unless stop_all comes first: then cancel it and raise the 503."""
        task = asyncio.ensure_future(awaitable)
        stop = asyncio.ensure_future(self.stopping.wait())
        try:
            await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
            if not task.done():
                task.cancel()
        if task.done() and not task.cancelled():
            return task.result()
        raise api_error(Stopped("shutdown"))

    def stop_all(self) -> None:
        """On the loop: answer 503 to every request waiting or running here, and to any that comes."""
        self.closing = True
        self.stopping.set()

    def close(self) -> None:
        """Refuse new calls and drop those not started; a running call ends in its thread."""
        self.stop_all()
        self.executor.shutdown(wait=False, cancel_futures=True)


def queue_full(slots: Slots) -> ApiError:
    """The 429 for a full line (every place taken, `slots.max_queue` requests waiting)."""
    return ApiError(
        429,
        f"the server is busy: {slots.max_queue} requests are waiting (--max-queue); retry shortly",
        code="queue_full",
        type="rate_limit_error",
        headers={"Retry-After": RETRY_AFTER},
    )


def _call(function, args):
    try:
        return function(*args)
    except BaseException as error:
        error = _without_frames(error)  # first: its frames hold what the call built, which the trim then hands back
        release_freed_memory()
        raise error from None


def _on_loop(loop, callback) -> None:
    try:
        loop.call_soon_threadsafe(callback)
    except RuntimeError:  # the loop is closed: nobody waits for the place any more
        pass
