"""/tokenize and /detokenize: the tokenizer's work, off the event loop and one request at a time.

A tokenizer call on a large body takes a second or more; run on the loop (or holding the GIL) it stalls
/health and every stream, and many at once in the shared worker threads each leave their heap behind (glibc
keeps a thread's freed memory in its arena). So each call runs in this worker's one thread, with the GIL
released (text/tokenizer.py), its JSON answer built there too, then the freed heap is handed back to the
system. A request waits for the thread at most until its deadline (408)."""

import asyncio
import json
import time
from concurrent.futures import ThreadPoolExecutor

from ..engine.session import release_freed_memory
from ..text import tokenizer as tokenizing
from .errors import ApiError


class TextWork:
    def __init__(self, model):
        self.model = model
        self.executor = ThreadPoolExecutor(1, thread_name_prefix="edgelm-tokenize")
        self.turn = asyncio.Semaphore(1)  # one body held by the thread, the others wait without a thread

    async def tokens(self, content: str, add_special: bool, deadline: float) -> str:
        """`{"tokens": [...]}` of `content`, as JSON text."""
        return await self._run(self._tokens, content, add_special, deadline=deadline)

    async def text(self, ids: list, deadline: float) -> str:
        """`{"content": ...}` of the token ids (special tokens kept: the inverse of /tokenize), as JSON text."""
        return await self._run(self._text, ids, deadline=deadline)

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)

    async def _run(self, work, *args, deadline: float):
        try:
            await asyncio.wait_for(self.turn.acquire(), max(deadline - time.monotonic(), 0))
        except asyncio.TimeoutError:
            raise ApiError(
                408,
                "the request waited past its deadline (--request-timeout) for the tokenizer; retry later",
                code="request_timeout",
                type="timeout_error",
            ) from None
        try:
            return await asyncio.get_running_loop().run_in_executor(self.executor, _then_release, work, args)
        finally:
            self.turn.release()

    def _tokens(self, content: str, add_special: bool) -> str:
        return json.dumps({"tokens": tokenizing.encode(self.model.tokenizer, content, add_special).ids})

    def _text(self, ids: list) -> str:
        return json.dumps({"content": tokenizing.decode(self.model.tokenizer, ids, skip_special_tokens=False)})


def _then_release(work, args):
    try:
        return work(*args)
    finally:
        release_freed_memory()
