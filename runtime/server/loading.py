"""The server while its model loads: the socket listens from the start, so an app that spawned it can tell
"loading" from "not there" during a cold start (hashing a package's files and creating its session take seconds).

    Gate (the ASGI app uvicorn serves) -> before open(): GET /health 503 {"status": "loading"}; any other request
                                          503 in OpenAI's error shape, code "model_loading", Retry-After: 1
                                       -> after open(app): every request goes to create_app's app

The ready line (uvicorn_server.run's `ready`) is called once both have happened, the socket listening and the
model loaded, so it still means the server can answer. The gate runs the lifespan itself and, at shutdown, the
app's own (which stops its jobs), whether the app arrived before the server started or after.
"""

import threading
from types import SimpleNamespace

from .api_errors import ApiError

LOADING = ApiError(
    503, "the model is loading; retry when GET /health says ok", code="model_loading", type="server_error",
    headers={"retry-after": "1"},
)  # fmt: skip


class Gate:
    """An ASGI app that answers "loading" until open(app), then passes every request to `app`."""

    def __init__(self, read_timeout: float):
        self.app = None
        self.limits = SimpleNamespace(read_timeout=read_timeout)  # what uvicorn_server.server reads before open()
        self._ready, self._address, self._lock = None, None, threading.Lock()

    def open(self, app, ready=None) -> None:
        """Serve `app` (create_app's) from now on, started (app.start: its lifespan ran before it was made);
        `ready(address)` once the socket listens too."""
        app.start()
        self.app = app
        self.limits = app.limits
        with self._lock:
            self._ready = ready
            address = self._address
        if ready is not None and address is not None:
            ready(address)

    def listening(self, address: dict) -> None:
        """Called by the server once its socket listens (uvicorn_server.run's `ready`)."""
        with self._lock:
            self._address = address
            ready = self._ready
        if ready is not None:
            ready(address)

    def stop_all(self) -> None:
        if self.app is not None:
            self.app.stop_all()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan":
            return await self._lifespan(scope, receive, send)
        if self.app is not None:
            return await self.app(scope, receive, send)
        if scope["type"] != "http":  # a websocket: nothing is served there
            return await send({"type": "websocket.close", "code": 1013})
        loading = scope["path"] == "/health" and scope["method"] in ("GET", "HEAD")
        body = b'{"status":"loading"}' if loading else LOADING.json()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        headers += [(k.encode(), v.encode()) for k, v in LOADING.headers.items()]
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else body})

    async def _lifespan(self, scope, receive, send):
        await receive()  # lifespan.startup
        await send({"type": "lifespan.startup.complete"})
        await receive()  # lifespan.shutdown
        if self.app is not None:  # the app's own lifespan, both steps at once: its startup does nothing
            steps = iter([{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}])

            async def step():
                return next(steps)

            async def ignore(message):
                pass

            await self.app(scope, step, ignore)  # start() does nothing the second time
        await send({"type": "lifespan.shutdown.complete"})
