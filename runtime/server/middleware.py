"""ASGI middleware around the Starlette app: the Host check, CORS, the API-key check and the access log.

    AccessLog -> HostCheck -> [CORSMiddleware, with --allow-origin only] -> ApiKey -> the routes

A web page the user opens can send requests to a server on localhost: a "simple" cross-origin POST needs no
preflight, and a DNS-rebinding page reaches it under its own host name. The Host check refuses names the
server is not known by, the routes take only JSON bodies (a simple request cannot send them), and without
--allow-origin no CORS header is sent, so a browser lets no page read an answer.
"""

import hmac
import logging
import time

from starlette.middleware.cors import CORSMiddleware

from .api_errors import ApiError

log = logging.getLogger("edgelm.server")
LOCAL_NAMES = ("127.0.0.1", "localhost", "[::1]")
WILDCARDS = ("0.0.0.0", "::", "")


class HostCheck:
    """ASGI middleware: refuse (421) a request whose Host header names none of the server's addresses.

    Accepted: 127.0.0.1, localhost, [::1], the bind address, the address the connection arrived on (a client
    that typed an IP address), and each --allow-host name; each with or without the server's port. "*" in
    `allowed` turns the check off (behind a proxy that checks hosts itself)."""

    def __init__(self, app, bind_host: str, allowed: tuple = ()):
        self.app = app
        names = {*LOCAL_NAMES, *(_bracketed(h) for h in allowed)}
        if bind_host not in WILDCARDS:
            names.add(_bracketed(bind_host))
        self.names = {n.lower() for n in names}
        self.any = "*" in allowed

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and not self.any:
            host = _header(scope, b"host")
            if host is not None and not self._known(host.decode("latin-1").lower(), scope.get("server")):
                error = ApiError(
                    421,
                    "this server is not known by the name in the Host header; start it with --allow-host NAME to "
                    "accept that name",
                    code="invalid_host",
                )
                return await error_response(error, send)
        return await self.app(scope, receive, send)

    def _known(self, host: str, server) -> bool:
        if host.startswith("["):  # [::1] or [::1]:8000
            end = host.find("]") + 1
            name, port = host[:end], host[end:]
        else:
            name, port = host[: host.find(":")] if ":" in host else host, host[host.find(":") :] if ":" in host else ""
        if port and (server is None or port != f":{server[1]}"):
            return False
        here = {_bracketed(server[0]).lower()} if server else set()
        return bool(name) and (name in self.names or name in here)


class ApiKey:
    """ASGI middleware: with a key set, every request but GET /health (/v1/, /tokenize, /detokenize) needs
    `Authorization: Bearer KEY` (401 otherwise).
    The key is compared as UTF-8 bytes in constant time, so a non-ASCII key works and timing tells nothing."""

    def __init__(self, app, key: str | None):
        self.app, self.key = app, key.encode("utf-8") if key else None

    async def __call__(self, scope, receive, send):
        if self.key and scope["type"] == "http" and scope["path"] != "/health":
            given = _header(scope, b"authorization") or b""
            if given[:7].lower() != b"bearer ":
                error = ApiError(
                    401, "no API key: send it as the header 'Authorization: Bearer KEY'", code="invalid_api_key"
                )
            elif not hmac.compare_digest(given[7:].strip(), self.key):
                error = ApiError(401, "incorrect API key", code="invalid_api_key")
            else:
                return await self.app(scope, receive, send)
            return await error_response(error, send)
        return await self.app(scope, receive, send)


def cors(app, origins: tuple):
    """Browsers may call the server from these origins ("*": any), preflight included; without any, no CORS."""
    if not origins:
        return app
    return CORSMiddleware(
        app,
        allow_origins=list(origins),
        allow_methods=["GET", "POST"],
        allow_headers=["authorization", "content-type"],
        max_age=600,
    )


class AccessLog:
    """ASGI middleware: one log line per request (method, path, status, generated tokens, duration). What the
    client sent is escaped: a %0d%0a in a path must not start a line of its own in the log."""

    def __init__(self, app, metrics=None, routes: tuple = ()):
        self.app, self.metrics, self.routes = app, metrics, set(routes)  # with --metrics: each request counted

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
            seconds = time.perf_counter() - started
            log.info(
                "%s %s %s tokens=%s %.3fs",
                printable(scope["method"]),
                printable(scope["path"]),
                shown,
                state.get("tokens", "-"),
                seconds,
            )
            if self.metrics is not None:
                self.metrics.request(self._endpoint(scope["path"]), state.get("error") or status[0] or 499, seconds)

    def _endpoint(self, path: str) -> str:
        """The route a path took, as a bounded label: never the client's own text."""
        if path in self.routes:
            return path
        return "/v1/models/{name}" if path.startswith("/v1/models/") else "other"


def printable(text: str, limit: int = 200) -> str:
    """`text` with control characters, backslashes and lone surrogates escaped (\\r, \\x1b, \\ud800), cut to `limit`."""
    out = "".join(c if c.isprintable() and c != "\\" else c.encode("unicode_escape").decode("ascii") for c in text)
    return out if len(out) <= limit else out[:limit] + "..."


async def error_response(error: ApiError, send) -> None:
    """Send `error` as a whole response, straight on the ASGI channel (no request object needed)."""
    body = error.json()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode("latin-1"), str(v).encode("latin-1")) for k, v in error.headers.items()]
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _header(scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return value
    return None


def _bracketed(host: str) -> str:
    """An IPv6 address as it appears in a Host header: [::1]."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host
