"""Request bodies read and response bodies written: JSON only, within the server's size and time limits."""

import asyncio
import json
import time

from starlette.responses import Response

from .api.requests import Limits
from .api_errors import ApiError


async def read_body(request, limits: Limits, deadline: float) -> bytes:
    """The body's bytes, to be parsed by parse_json. Refused: a content type other than application/json (415: a
    web page cannot send that without the browser asking first), past --max-body-bytes (413), not complete within
    --read-timeout or the request's deadline (408, and the connection is closed)."""
    media_type, _, parameters = request.headers.get("content-type", "").partition(";")
    charset = parameters.strip().lower().replace(" ", "")
    if media_type.strip().lower() != "application/json" or charset not in ("", "charset=utf-8", "charset=\"utf-8\""):
        raise ApiError(
            415,
            "the request body must be JSON, sent with the header 'Content-Type: application/json'",
            code="unsupported_media_type",
        )
    declared = request.headers.get("content-length", "")
    too_large = ApiError(
        413, f"the request body is over {limits.max_body_bytes} bytes (--max-body-bytes)", code="request_too_large"
    )
    if declared.isdigit() and int(declared) > limits.max_body_bytes:
        raise too_large

    async def read() -> bytes:
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > limits.max_body_bytes:
                raise too_large
        return bytes(body)

    wait = min(limits.read_timeout, deadline - time.monotonic())
    try:
        body = await asyncio.wait_for(read(), max(wait, 0))
    except asyncio.TimeoutError:
        raise ApiError(
            408,
            f"the request body did not arrive within {wait:g} s (--read-timeout)",
            code="request_timeout",
            type="timeout_error",
            headers={"Connection": "close"},
        ) from None
    return body


def parse_json(body: bytes):
    """The body as JSON; 400 for one that is not JSON. Parsing a body near --max-body-bytes takes milliseconds:
    run it in a worker thread (request_path.py, text_work.py), never on the event loop."""
    try:
        return json.loads(body, parse_constant=_no_constants)
    except RecursionError:
        raise ApiError(400, "the request body is nested too deeply to be a request", code="invalid_json") from None
    except ValueError as error:  # JSONDecodeError and UnicodeDecodeError are both ValueErrors
        raise ApiError(400, f"the request body is not valid JSON: {error}", code="invalid_json") from None


def _no_constants(name: str):
    raise ValueError(f"{name} is not a JSON number")


def json_response(body, status: int = 200, headers: dict | None = None) -> Response:
    """A JSON response from a dict (ASCII JSON) or a pydantic model."""
    content = body.model_dump_json() if hasattr(body, "model_dump_json") else json.dumps(body)
    return Response(content, status, headers, media_type="application/json")
