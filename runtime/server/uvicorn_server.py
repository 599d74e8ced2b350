"""uvicorn, set up for edgelm: the h11 protocol with a deadline on each request's head, graceful shutdown.

uvicorn times out idle keep-alive connections, but not a client that sends its request line and headers
slowly (a byte every few seconds), nor one that connects and sends nothing: such a connection stays open as
long as the client likes, and enough of them exhaust the process's sockets. Here a connection must complete
its first request head within `header_timeout` seconds of opening, and each later one within `header_timeout`
seconds of its first byte, or it is closed. The body has its own
deadline in the route (bodies.read_body).
"""

import asyncio
import functools
import os
import signal
import sys
import threading
import time

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol



def run(
    app, host: str, port: int, log_level: str = "info", shutdown_timeout: float = 5.0, uds: str | None = None,
    ready=None, parent_pid: int | None = None, stdin_closes: bool = False, load=None,
) -> None:  # fmt: skip
    """Serve `app` with uvicorn until SIGINT/SIGTERM; a requested shutdown returns normally (exit code 0).
    `uds`: a Unix socket's path instead of host and port. `ready(address)` is called once the server listens, with
    {"host", "port"} (the port bound, for port 0) or {"uds"}. The server stops as SIGTERM stops it when the
    process `parent_pid` ends, or with `stdin_closes` when its standard input reaches its end. `load()` runs in a
    thread of its own while the server listens (loading.py's Gate answers meanwhile); if it raises, the server
    stops and run raises its error."""
    # uvicorn re-raises the signal after its clean shutdown, which would kill the process with it;
    # handlers that do nothing make that a normal return.
    previous = {s: signal.signal(s, lambda *_: None) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        running = server(app, host, port, log_level, shutdown_timeout, uds)
        running.ready = ready
        if parent_pid is not None:
            threading.Thread(target=_exit_with_process, args=(running, parent_pid), daemon=True).start()
        if stdin_closes:
            threading.Thread(target=_exit_with_stdin, args=(running,), daemon=True).start()
        failed = []
        if load is not None:
            threading.Thread(target=_load, args=(running, load, failed), daemon=True).start()
        running.run()
        if failed:
            raise failed[0]
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _load(running, load, failed: list) -> None:
    """Run `load()`; on failure keep its error in `failed` and stop the server."""
    try:
        load()
    except BaseException as error:  # noqa: BLE001 (the command reports it once the server has stopped)
        failed.append(error)
        running.should_exit = True


def _exit_with_process(running, pid: int) -> None:
    """Stop the server once process `pid` is gone (a sidecar's app died, however it died)."""
    while not running.should_exit:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            running.should_exit = True
            return
        except PermissionError:  # alive, another user's
            pass
        time.sleep(0.5)


def _exit_with_stdin(running) -> None:
    """Stop the server once standard input ends: the pipe a parent spawned it with closes when the parent dies."""
    try:  # the file descriptor, not sys.stdin: a thread blocked in a buffered read holds its lock at exit, a fatal error
        while os.read(sys.stdin.fileno(), 65536):
            pass
    except (OSError, ValueError):
        pass
    running.should_exit = True


def server(
    app, host: str, port: int, log_level: str = "info", shutdown_timeout: float = 5.0, uds: str | None = None
) -> "GracefulServer":
    """The uvicorn server for `app` (from create_app): its h11 protocol times out slow request heads."""
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        uds=uds,
        http=functools.partial(HeaderTimeoutProtocol, header_timeout=app.limits.read_timeout),
        access_log=False,
        log_config=None,
        log_level=log_level,
        timeout_graceful_shutdown=shutdown_timeout + 5,  # a backstop: GracefulServer stops jobs first
    )
    return GracefulServer(config, app.stop_all, shutdown_timeout)


class GracefulServer(uvicorn.Server):
    """uvicorn's server, stopping the requests still running `grace` seconds into a shutdown (`stop_all`: their
    generations, and those still being prepared or tokenized), so that their clients get a clean 503 or a final
    error event rather than a cut connection."""

    def __init__(self, config, stop_all, grace: float):
        super().__init__(config)
        self.stop_all, self.grace, self.ready = stop_all, grace, None

    async def startup(self, sockets=None):
        await super().startup(sockets)
        if self.ready is not None and not self.should_exit and self.servers:
            address = self.servers[0].sockets[0].getsockname()
            self.ready({"uds": address} if isinstance(address, str) else {"host": address[0], "port": address[1]})

    async def shutdown(self, sockets=None):
        asyncio.get_running_loop().call_later(self.grace, self.stop_all)
        await super().shutdown(sockets)


class HeaderTimeoutProtocol(H11Protocol):
    """H11Protocol that closes a connection whose request head is not complete within `header_timeout` s."""

    def __init__(self, *args, header_timeout: float = 5.0, **kwargs):
        super().__init__(*args, **kwargs)
        self.header_timeout = header_timeout
        self._head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._head_timer is None and self._waiting_for_head():
            self._arm()  # the first bytes of the next request on a kept-alive connection: its head gets the same time
        super().data_received(data)

    def on_response_complete(self) -> None:
        # Until the next request's first byte, the connection is idle: uvicorn's keep-alive timeout closes it.
        self._disarm()
        super().on_response_complete()

    def connection_lost(self, exc) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._head_timer = self.loop.call_later(self.header_timeout, self._head_timed_out)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _waiting_for_head(self) -> bool:
        """No request is in flight: the last one (if any) is answered and the next one's head is not complete."""
        return self.cycle is None or self.cycle.response_complete

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self._waiting_for_head() and not self.transport.is_closing():
            try:
                self.conn.send(h11.ConnectionClosed())
            except h11.LocalProtocolError:  # mid-way through a request line: nothing to tell h11
                pass
            self.transport.close()
