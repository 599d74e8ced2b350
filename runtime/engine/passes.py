"""Where a batch-1 prompt's prefill passes begin and end: passes of `chunk` tokens, broken at its conversation start.

A prompt over the in-place cache is prefilled in passes of PREFILL_CHUNK tokens (decode.py), and int8 graphs
quantize activations per pass: a row depends on the pass that made it. A cache of rows (the package's prompt cache,
the prefix cache, its disk store) can give a prompt only rows made in the passes its own prefill would make. So
that a conversation's whole start (a system prompt and tools, rendered by the chat template: a length that is no
multiple of the chunk) can be kept, the schedule breaks at that start's end whether or not a cache holds it:

    prompt of T tokens starting with a known start of S tokens (0 < S < T, S not a multiple of chunk):
        [0, chunk) [chunk, 2 chunk) ... [S // chunk * chunk, S)   the start, as a prefill of the start alone makes it
        [S, S + chunk) ... [.., T)                                the rest, from the start's end
    any other prompt: [0, chunk) [chunk, 2 chunk) ... [.., T)

A cold prefill and a warm one (the start's rows copied in, the rest computed) run the same passes, so their rows and
logits are the same bits. The known starts (Starts) are the package's prompt cache (kept for good), and the starts of
the conversations the chat path rendered (Model.chat_ids: their leading system messages and tools) or a saved session
recorded (Model.load_session), the most recent MAX_STARTS of them. A prompt of token ids that begins with a known
start is prefilled in the same passes as the conversations that have it.
"""

import threading
from collections import OrderedDict

import numpy as np

MAX_STARTS = 32  # conversation starts remembered: the system prompts (and tool sets) an app or a server uses at once


def break_at(start: int, length: int, chunk: int) -> int:
    """The position a prompt of `length` tokens whose known start is `start` tokens breaks its passes at; 0 for no
    break (no start, a start of whole chunks, or one that is the whole prompt or longer)."""
    return start if 0 < start <= length and start % chunk else 0


def prefill_passes(length: int, chunk: int, start: int = 0) -> list[tuple[int, int]]:
    """The [begin, end) of each pass that prefills `length` tokens in passes of `chunk`, broken at `start`."""
    start = break_at(start, length, chunk)
    edges = [*range(0, start, chunk), *range(start, length, chunk), length]
    return list(zip(edges[:-1], edges[1:]))


def kept_passes(length: int, chunk: int, start: int = 0) -> list[tuple[int, int]]:
    """The passes of prefill_passes whose rows a cache keeps: whole ones, and the one ending at the start (a partial
    last pass is the prompt's own: a longer prompt makes that pass longer)."""
    start = break_at(start, length, chunk)
    return [(b, e) for b, e in prefill_passes(length, chunk, start) if e - b == chunk or e == start]


def kept_end(length: int, chunk: int, start: int = 0) -> int:
    """The tokens of a prompt of `length` whose rows a cache keeps: the end of its last kept pass (0 for none)."""
    passes = kept_passes(length, chunk, start)
    return passes[-1][1] if passes else 0


class Starts:
    """The conversation starts the prefill breaks at: token-id arrays, a pinned few and the most recent others."""

    def __init__(self):
        self._pinned: list = []
        self._recent: OrderedDict = OrderedDict()  # int64 bytes -> the ids [S]
        self._lock = threading.Lock()

    def add(self, ids, pinned: bool = False) -> None:
        """Remember `ids` as a conversation start (pinned: for good, as a package's prompt cache)."""
        ids = np.asarray(ids, dtype=np.int64)
        if not len(ids):
            return
        with self._lock:
            if pinned:
                self._pinned.append(ids)
                return
            key = ids.tobytes()
            self._recent[key] = ids
            self._recent.move_to_end(key)
            while len(self._recent) > MAX_STARTS:
                self._recent.popitem(last=False)

    def longest(self, ids) -> int:
        """The length of the longest known start that the prompt `ids` [T] begins with (0 when none)."""
        ids = np.asarray(ids)
        with self._lock:
            known = [*self._pinned, *self._recent.values()]
        return max((len(s) for s in known if len(s) <= len(ids) and np.array_equal(ids[: len(s)], s)), default=0)
