"""/tokenize and /detokenize: the tokenizer's work, off the event loop and one request at a time.

A tokenizer call on a large body takes a second or more; run on the loop (or holding the GIL) it stalls
/health and every stream, and many at once in the shared worker threads each leave their heap behind (glibc
keeps a thread's freed memory in its arena). So each request's body is parsed and its call runs in this worker's
one thread (workers.py), with the GIL released (text/tokenizer.py), its JSON answer built there too, then the
freed heap is handed back to the system. The requests waiting for the thread count against --max-queue with
those waiting for a slot (429 past it, 408 at the deadline); a request whose client leaves while it waits never
runs, so a burst of abandoned bodies costs nothing after its clients are gone."""

import json
import time

from ..engine.session import release_freed_memory
from ..errors import EdgelmError
from ..text import tokenizer as tokenizing
from .api import requests
from .api.requests import Limits
from .bodies import parse_json, read_body
from .api_errors import ApiError
from .workers import Workers


class TextWork:
    def __init__(self, model, limits: Limits, max_queue: int, line: list):
        self.model, self.limits = model, limits
        self.workers = Workers("tokenize", 1, max_queue, line)

    async def tokens(self, request) -> str:
        """`{"tokens": [...]}` of a /tokenize body's content, as JSON text."""
        return await self._run(request, self._tokens)

    async def text(self, request) -> str:
        """`{"content": ...}` of a /detokenize body's token ids (special tokens kept: the inverse of /tokenize),
        as JSON text."""
        return await self._run(request, self._text)

    def close(self) -> None:
        self.workers.close()

    async def _run(self, request, work) -> str:
        deadline = time.monotonic() + self.limits.request_timeout
        body = await read_body(request, self.limits, deadline)
        return await self.workers.run(request, deadline, self.limits.request_timeout, _then_release, work, body)

    def _tokens(self, body: bytes) -> str:
        parsed = requests.parse_tokenize_request(parse_json(body))
        try:
            ids = tokenizing.encode(self.model.tokenizer, parsed.content, parsed.add_special).ids
        except EdgelmError as error:  # the package's tokenizer failed on this text
            raise ApiError(400, str(error), "content") from None
        return json.dumps({"tokens": ids})

    def _text(self, body: bytes) -> str:
        ids = requests.parse_detokenize_request(parse_json(body), self.model.arch.vocab_size)
        try:
            content = tokenizing.decode(self.model.tokenizer, ids, skip_special_tokens=False)
        except EdgelmError as error:
            raise ApiError(400, str(error), "tokens") from None
        return json.dumps({"content": content})


def _then_release(work, body: bytes) -> str:
    try:
        return work(body)
    finally:
        release_freed_memory()
