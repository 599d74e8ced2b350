"""Recent prompts' key/value rows, kept so that a prompt which repeats their start skips prefilling it.

A chat sends its whole history every turn and apps reuse one long system prompt: the next prompt often starts
with tokens the model has already seen. The cache keeps the rows the in-place decoder wrote for those tokens,
one block per prefill pass, and a later prompt that starts with the same token ids gets them copied in instead
of computed.

Blocks are prefill passes. The decoder prefills a prompt in passes of `chunk` tokens, broken at the end of its
conversation start (runtime/engine/passes.py: 0-128, 128-256, 256-300 for a 300-token system prompt, then 300-428,
...), and int8 graphs quantize activations per pass, so a row depends on the pass that made it. A block holds the
rows of one pass, whole or ending at the conversation start, reused only before the same tokens' later passes: the
rows copied in are the bits a cold prefill computes, and the outputs are identical with and without the cache
(tests/engine/test_prefix_cache.py). The last pass of a prompt is stored only when it is whole or ends at its start.

The blocks form a trie: a block's key is its own token ids (their count is the pass's length), under the block
before it, so a path from the root is a schedule of passes, and prompts that share a start share its blocks.
Memory is bounded by bytes; the least recently used block goes first, and a block is always used more recently
than the blocks after it, so eviction takes a path's end before its start.
One cache serves every thread of a model: a lock guards the trie, and blocks are never changed once stored.
Pinned blocks (pin(): a package's prompt cache, runtime/batching/package_prefix.py) sit in the same trie but are
never evicted and not counted in max_bytes; a cache of max_bytes 0 holds those alone. With a disk store
(prefix_store.py), preload() puts its most recently used blocks in memory at load, and a prompt whose start is
not in memory looks for its blocks there.
"""

import math
import numbers
import threading
from collections import OrderedDict

import numpy as np

from ..engine.passes import break_at, kept_passes, prefill_passes
from ..errors import GenerationOptionError

# `edgelm serve` and `edgelm chat` keep this many MiB by default: they see prompts that repeat (a conversation
# resends its history each turn), and 64 MiB holds distilgpt2's whole 1,024-token context in float32 rows
# (36 KiB a token) with room to spare. load() keeps none unless asked: one prompt per process gains nothing.
CLI_DEFAULT_MB = 64


class Block:
    """The rows of one prefill pass's tokens: one NumPy array [H, n, D] per cache tensor, in the cache's dtype."""

    __slots__ = ("key", "rows", "parent", "children")

    def __init__(self, key: bytes, rows, parent):
        self.key, self.rows, self.parent = key, rows, parent
        self.children: dict = {}  # the next chunk's token ids (int64 bytes) -> Block

    @property
    def nbytes(self) -> int:
        return sum(rows.nbytes for rows in self.rows)


class PrefixCache:
    """Key/value rows of recent prompts' first prefill passes, at most `max_bytes` of them."""

    def __init__(self, max_bytes: int, chunk: int, disk=None):
        self.max_bytes, self.chunk = int(max_bytes), int(chunk)
        self.disk = disk  # a PrefixStore (prefix_store.py): blocks kept on disk across restarts, or None
        self.bytes = 0  # the stored blocks' rows
        self.reused_tokens = 0  # prompt tokens whose rows came from the cache, over the cache's life
        self._root = Block(b"", None, None)
        self._recent: OrderedDict = OrderedDict()  # Block -> None, least recently used first
        self._pinned: set = set()  # blocks kept for good (pin()), from the root on: never in _recent
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._recent)

    def restore(self, ids, start: int, buffers: list) -> int:
        """Copy the stored rows of the longest stored start of `ids` [T], prefilled in passes broken at `start`
        (passes.py), into `buffers` (each [1, H, capacity, D], in the decoder's order) and return its length: the
        end of a pass, below T so that a pass is left to give the last position's logits."""
        passes = [p for p in prefill_passes(len(ids), self.chunk, start) if p[1] < len(ids)]
        with self._lock:
            path = self._walk(ids, passes)
        if self.disk is not None and len(path) < len(passes):
            path = self._from_disk(ids, start, passes, path, lambda n: [b[0, :, :n] for b in buffers])
        restored = _end(passes, path)
        with self._lock:
            self._touch([block for block in path if block in self._recent])
            self.reused_tokens += restored
        for (begin, end), block in zip(passes, path):  # outside the lock: stored rows never change
            for buffer, rows in zip(buffers, block.rows):
                buffer[0, :, begin:end] = rows
        return restored

    def store(self, ids, start: int, buffers: list) -> None:
        """Keep the rows `buffers` hold for the passes of the prompt `ids` [T] (its prefill, broken at `start`, just
        wrote them) that are whole or end at the start, the blocks not stored yet copied, then evict down to
        max_bytes."""
        passes = self._kept(len(ids), start)
        with self._lock:
            known = len(self._walk(ids, passes))
        if known == len(passes) or self._block_bytes(buffers) > self.max_bytes:
            return
        # Copied outside the lock; another thread may store the same blocks meanwhile, and then its copy stays.
        copies = [tuple(b[0, :, begin:end].copy() for b in buffers) for begin, end in passes[known:]]
        with self._lock:
            path, parent = [], self._root
            for k, (begin, end) in enumerate(passes):
                key = self._key(ids, begin, end)
                block = parent.children.get(key)
                if block is None:
                    if k < known:  # evicted since the walk above: keep what still hangs together
                        break
                    block = parent.children[key] = Block(key, copies[k - known], parent)
                    self.bytes += block.nbytes
                path.append(block)
                parent = block
            self._touch(path)
            while self.bytes > self.max_bytes:
                self._evict(next(iter(self._recent)))
        if self.disk is not None:
            for (begin, end), rows in zip(passes[known:], copies):
                self.disk.save(ids[:end], break_at(start, end, self.chunk), rows)

    def pin(self, ids, rows: tuple) -> None:
        """Keep the rows of `ids` [T] for good: `rows` holds one array [H, T, D] per cache tensor, in the decoder's
        order, as a prefill of `ids` alone wrote them (its passes broken at T: it is a conversation start)."""
        ids = np.asarray(ids, dtype=np.int64)
        with self._lock:
            parent = self._root
            for begin, end in self._kept(len(ids), len(ids)):
                key = self._key(ids, begin, end)
                block = parent.children.get(key)
                if block is None:  # views of `rows`: one copy of the file's rows in memory
                    block = parent.children[key] = Block(key, tuple(r[:, begin:end] for r in rows), parent)
                elif block in self._recent:
                    del self._recent[block]
                    self.bytes -= block.nbytes
                self._pinned.add(block)
                parent = block

    def preload(self, like) -> int:
        """Put the disk store's most recently used blocks (and the blocks before them) in memory, within
        max_bytes, each read whole and checked as a miss would read it: a restarted process finds in memory what
        it kept before. like(n): one array [H, n, D] per cache tensor, shaped and typed as a block of n tokens.
        The tokens whose rows it put in memory."""
        loaded = 0
        for ids, start in self.disk.recent():
            if self.bytes >= self.max_bytes:
                break
            passes = self._kept(len(ids), start)
            if not passes or passes[-1][1] != len(ids):
                continue
            with self._lock:
                path = self._walk(ids, passes)
            missing = passes[len(path) :]
            size = sum(a.nbytes for begin, end in missing for a in like(end - begin))
            if not missing or self.bytes + size > self.max_bytes:
                continue
            before = _end(passes, path)
            path = self._from_disk(ids, start, passes, path, like)
            with self._lock:
                self._touch([block for block in path if block in self._recent])
            loaded += _end(passes, path) - before
        return loaded

    def _from_disk(self, ids, start: int, passes: list, path: list, like) -> list:
        """`path` extended by the blocks the disk store holds for ids' next passes, each put in memory too."""
        path = list(path)
        for begin, end in passes[len(path) :]:
            rows = self.disk.load(ids[:end], break_at(start, end, self.chunk), like(end - begin))
            if rows is None:
                break
            with self._lock:
                parent = path[-1] if path else self._root
                key = self._key(ids, begin, end)
                block = parent.children.get(key)
                if block is None and (parent is self._root or parent in self._recent or parent in self._pinned):
                    block = parent.children[key] = Block(key, rows, parent)
                    self.bytes += block.nbytes
                    self._touch([block])
                path.append(block if block is not None else Block(key, rows, None))
        return path

    def stats(self) -> dict:
        """What the cache holds and has saved, for a server's /health: its bound and the bytes stored (of key/value
        rows), the blocks of `chunk` tokens, the prompt tokens whose rows were copied in instead of computed, and the
        tokens of the pinned blocks (a package's prompt cache)."""
        with self._lock:
            return {
                "max_bytes": self.max_bytes,
                "bytes": self.bytes,
                "blocks": len(self._recent),
                "chunk_tokens": self.chunk,
                "reused_tokens": self.reused_tokens,
                "pinned_tokens": sum(len(block.key) // 8 for block in self._pinned),
            }

    def clear(self) -> None:
        """Drop every block but the pinned ones."""
        with self._lock:
            for block in list(self._recent):
                if block in self._recent:  # not dropped with a block before it
                    self._evict(block)

    def _kept(self, length: int, start: int) -> list:
        return kept_passes(length, self.chunk, start)

    def _key(self, ids, begin: int, end: int) -> bytes:
        return np.asarray(ids[begin:end]).astype("int64", copy=False).tobytes()

    def _walk(self, ids, passes: list) -> list:
        """The stored blocks of ids' first `passes`, from the start, up to the first one missing."""
        path, block = [], self._root
        for begin, end in passes:
            block = block.children.get(self._key(ids, begin, end))
            if block is None:
                break
            path.append(block)
        return path

    def _touch(self, path: list) -> None:
        """Mark a path as just used, its end first: each block stays more recent than the blocks after it."""
        for block in reversed(path):
            if block in self._pinned:
                continue
            self._recent[block] = None
            self._recent.move_to_end(block)

    def _evict(self, block: Block) -> None:
        """Drop a block and everything stored after it (by the recency order, nothing is)."""
        for child in list(block.children.values()):
            self._evict(child)
        del block.parent.children[block.key]
        del self._recent[block]
        self.bytes -= block.nbytes

    def _block_bytes(self, buffers: list) -> int:
        return sum(self.chunk * b[0, :, 0].nbytes for b in buffers)


def _end(passes: list, path: list) -> int:
    """The token the first len(path) of `passes` end at (0 for none): what a path of blocks holds."""
    return passes[len(path) - 1][1] if path else 0


def cache_bytes(megabytes) -> int:
    """The `prefix_cache_mb` option (a number of MiB, 0 for no cache) as bytes, checked where it enters."""
    if not isinstance(megabytes, numbers.Real) or isinstance(megabytes, bool) or not 0 <= megabytes < math.inf:
        raise GenerationOptionError(
            f"prefix_cache_mb must be a number of MiB >= 0 (0 turns the prefix cache off), got {str(megabytes)[:40]}",
            param="prefix_cache_mb",
        )
    return int(megabytes * (1 << 20))
