"""ASGI middleware around the Starlette app: the API-key check and the one-line-per-request access log."""

import hmac
import logging
import time

from starlette.responses import JSONResponse

from .schema import ApiError

log = logging.getLogger("edgelm.server")


class ApiKey:
    """ASGI middleware: with a key set, every /v1/ request needs `Authorization: Bearer KEY` (401 otherwise)."""

    def __init__(self, app, key: str | None):
        self.app, self.key = app, key

    async def __call__(self, scope, receive, send):
        if self.key and scope["type"] == "http" and scope["path"].startswith("/v1/"):
            given = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1")
            if given[:7].lower() != "bearer ":
                error = ApiError(
                    401, "no API key: send it as the header 'Authorization: Bearer KEY'", code="invalid_api_key"
                )
            elif not hmac.compare_digest(given[7:].strip().encode(), self.key.encode()):
                error = ApiError(401, "incorrect API key", code="invalid_api_key")
            else:
                return await self.app(scope, receive, send)
            return await JSONResponse(error.body(), status_code=401)(scope, receive, send)
        return await self.app(scope, receive, send)


class AccessLog:
    """ASGI middleware: one log line per request (method, path, status, generated tokens, duration)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started, status = time.perf_counter(), [None]
        state = scope.setdefault("state", {})

        async def send_and_note(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            shown = status[0] if state.get("error") in (None, status[0]) else f"{status[0]}->{state['error']}"
            log.info(
                "%s %s %s tokens=%s %.3fs",
                scope["method"],
                scope["path"],
                shown,
                state.get("tokens", "-"),
                time.perf_counter() - started,
            )
