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
import signal

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol



def run(app, host: str, port: int, log_level: str = "info", shutdown_timeout: float = 5.0) -> None:
    """Serve `app` with uvicorn until SIGINT/SIGTERM; a requested shutdown returns normally (exit code 0)."""
    # uvicorn re-raises the signal after its clean shutdown, which would kill the process with it;
    # handlers that do nothing make that a normal return.
    previous = {s: signal.signal(s, lambda *_: None) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        server(app, host, port, log_level, shutdown_timeout).run()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def server(app, host: str, port: int, log_level: str = "info", shutdown_timeout: float = 5.0) -> "GracefulServer":
    """The uvicorn server for `app` (from create_app): its h11 protocol times out slow request heads."""
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
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
        self.stop_all, self.grace = stop_all, grace

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
