"""The errors the server answers with: OpenAI's error body, and the one mapping from what a job or the runtime
raised to the status and `param` the client sees."""

import json

from ..errors import ChatError, DeadlineError, EdgelmError, PromptError
from .jobs import Stopped


class ApiError(Exception):
    """A request the server refuses, with its HTTP status, OpenAI's error fields and any extra response headers."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        type: str = "invalid_request_error",
        headers: dict | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def json(self) -> bytes:
        """The body as ASCII JSON: a message may quote client text (a lone surrogate included) and must still encode."""
        return json.dumps(self.body()).encode("ascii")


def api_error(error: BaseException, request_timeout: float | None = None, field_of=None) -> ApiError:
    """What the client gets for `error` (the caller logs an unexpected one): the one mapping from what the runtime,
    a job or the queue raised to an HTTP status and OpenAI's error fields. `field_of(name)` gives the request
    field a runtime option (or "prompt") came from (max_new_tokens -> max_tokens, prompt -> messages); without it
    the runtime's name is reported."""
    if isinstance(error, ApiError):
        return error
    if isinstance(error, DeadlineError) or (isinstance(error, Stopped) and error.reason == "timeout"):
        limit = f"{request_timeout:g} s " if request_timeout else ""
        return ApiError(
            408,
            f"the request ran longer than {limit}(--request-timeout), waiting included; ask for fewer tokens or retry later",
            code="request_timeout",
            type="timeout_error",
        )
    if isinstance(error, EdgelmError):  # every other error the library raises on purpose is about this request
        param = getattr(error, "param", None)
        if isinstance(error, PromptError):
            param = "prompt"
        elif isinstance(error, ChatError) and param is None:  # the template failed on these messages
            param = "messages"
        if field_of is not None:
            param = field_of(param)
        return ApiError(400, str(error), param, "invalid_prompt" if isinstance(error, PromptError) else None)
    if isinstance(error, Stopped):
        return ApiError(
            503, "the server is shutting down; retry in a moment", code="server_shutdown", type="server_error"
        )
    return ApiError(500, f"the server failed on this request: {describe(error)}", type="server_error")


def describe(error: BaseException) -> str:
    """`Type: message`, its message cut to one short line (it may quote client input)."""
    text = str(error)
    return f"{type(error).__name__}: {text[:300]}" if text else type(error).__name__
