"""Recent prompts' key/value rows, kept so that a prompt which repeats their start skips prefilling it.

A chat sends its whole history every turn and apps reuse one long system prompt: the next prompt often starts
with tokens the model has already seen. The cache keeps the rows the in-place decoder wrote for those tokens,
in blocks of `chunk` tokens, and a later prompt that starts with the same token ids gets them copied into its
cache instead of computed.

Blocks sit at prefill-chunk boundaries only. The decoder prefills a prompt in passes of `chunk` tokens
(0-128, 128-256, ...), and int8 graphs quantize activations per pass, so a row depends on the pass that made
it. A block holds the rows of one whole pass, reused only before the same tokens' later passes: the rows
copied in are the bits a cold prefill computes, and the outputs are identical with and without the cache
(tests/engine/test_prefix_cache.py). The last, partial pass of a prompt is never stored.

The blocks form a trie: a block's key is its own `chunk` token ids, under the block before it, so prompts that
share a start share its blocks. Memory is bounded by bytes; the least recently used block goes first, and a
block is always used more recently than the blocks after it, so eviction takes a path's end before its start.
One cache serves every thread of a model: a lock guards the trie, and blocks are never changed once stored.
Pinned blocks (pin(): a package's prompt cache, runtime/batching/package_prefix.py) sit in the same trie but are
never evicted and not counted in max_bytes; a cache of max_bytes 0 holds those alone.
"""

import math
import numbers
import threading
from collections import OrderedDict

import numpy as np

from ..errors import GenerationOptionError

# `edgelm serve` and `edgelm chat` keep this many MiB by default: they see prompts that repeat (a conversation
# resends its history each turn), and 64 MiB holds distilgpt2's whole 1,024-token context in float32 rows
# (36 KiB a token) with room to spare. load() keeps none unless asked: one prompt per process gains nothing.
CLI_DEFAULT_MB = 64


class Block:
    """The rows of `chunk` prompt tokens: one NumPy array [H, chunk, D] per cache tensor, in the cache's dtype."""

    __slots__ = ("key", "rows", "parent", "children")

    def __init__(self, key: bytes, rows, parent):
        self.key, self.rows, self.parent = key, rows, parent
        self.children: dict = {}  # the next chunk's token ids (int64 bytes) -> Block

    @property
    def nbytes(self) -> int:
        return sum(rows.nbytes for rows in self.rows)


class PrefixCache:
    """Key/value rows of recent prompts' first k * chunk tokens, at most `max_bytes` of them."""

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

    def restore(self, ids, buffers: list) -> int:
        """Copy the stored rows of the longest stored start of `ids` [T] into `buffers` (each [1, H, capacity, D],
        in the decoder's order) and return its length: a multiple of chunk, below T so that a pass is left to
        give the last position's logits."""
        limit = (len(ids) - 1) // self.chunk
        with self._lock:
            path = self._walk(ids, limit)
        if self.disk is not None and len(path) < limit:
            path = self._from_disk(ids, path, limit, buffers)
        with self._lock:
            self._touch([block for block in path if block in self._recent])
            self.reused_tokens += len(path) * self.chunk
        for k, block in enumerate(path):  # outside the lock: stored rows never change
            for buffer, rows in zip(buffers, block.rows):
                buffer[0, :, k * self.chunk : (k + 1) * self.chunk] = rows
        return len(path) * self.chunk

    def store(self, ids, buffers: list) -> None:
        """Keep the rows `buffers` hold for the whole chunks of the prompt `ids` [T] (its prefill just wrote
        them), the blocks not stored yet copied, then evict down to max_bytes."""
        whole = len(ids) // self.chunk
        with self._lock:
            known = len(self._walk(ids, whole))
        if known == whole or self._block_bytes(buffers) > self.max_bytes:
            return
        # Copied outside the lock; another thread may store the same blocks meanwhile, and then its copy stays.
        copies = [self._copy(buffers, k) for k in range(known, whole)]
        with self._lock:
            path, parent = [], self._root
            for k in range(whole):
                key = self._key(ids, k)
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
            for k, rows in enumerate(copies, start=known):
                self.disk.save(ids[: (k + 1) * self.chunk], rows)

    def pin(self, ids, rows: tuple) -> None:
        """Keep the rows of the whole chunks of `ids` [T] for good: `rows` holds one array [H, T, D] per cache
        tensor, in the decoder's order, as a prefill of `ids` in passes of `chunk` wrote them."""
        ids = np.asarray(ids, dtype=np.int64)
        with self._lock:
            parent = self._root
            for k in range(len(ids) // self.chunk):
                key = self._key(ids, k)
                block = parent.children.get(key)
                if block is None:  # views of `rows`: one copy of the file's rows in memory
                    span = slice(k * self.chunk, (k + 1) * self.chunk)
                    block = parent.children[key] = Block(key, tuple(r[:, span] for r in rows), parent)
                elif block in self._recent:
                    del self._recent[block]
                    self.bytes -= block.nbytes
                self._pinned.add(block)
                parent = block

    def _from_disk(self, ids, path: list, limit: int, buffers: list) -> list:
        """`path` extended by the blocks the disk store holds for ids' next chunks, each put in memory too."""
        like = [b[0, :, : self.chunk] for b in buffers]
        path = list(path)
        for k in range(len(path), limit):
            rows = self.disk.load(ids[: (k + 1) * self.chunk], like)
            if rows is None:
                break
            with self._lock:
                parent = path[-1] if path else self._root
                key = self._key(ids, k)
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
                "pinned_tokens": len(self._pinned) * self.chunk,
            }

    def clear(self) -> None:
        """Drop every block but the pinned ones."""
        with self._lock:
            for block in list(self._recent):
                if block in self._recent:  # not dropped with a block before it
                    self._evict(block)

    def _key(self, ids, k: int) -> bytes:
        return ids[k * self.chunk : (k + 1) * self.chunk].astype("int64", copy=False).tobytes()

    def _walk(self, ids, limit: int) -> list:
        """The stored blocks of ids' first `limit` chunks, from the start, up to the first one missing."""
        path, block = [], self._root
        for k in range(limit):
            block = block.children.get(self._key(ids, k))
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

    def _copy(self, buffers: list, k: int) -> tuple:
        # [1, H, capacity, D] per cache tensor -> [H, chunk, D] per cache tensor
        return tuple(b[0, :, k * self.chunk : (k + 1) * self.chunk].copy() for b in buffers)


def cache_bytes(megabytes) -> int:
    """The `prefix_cache_mb` option (a number of MiB, 0 for no cache) as bytes, checked where it enters."""
    if not isinstance(megabytes, numbers.Real) or isinstance(megabytes, bool) or not 0 <= megabytes < math.inf:
        raise GenerationOptionError(
            f"prefix_cache_mb must be a number of MiB >= 0 (0 turns the prefix cache off), got {str(megabytes)[:40]}",
            param="prefix_cache_mb",
        )
    return int(megabytes * (1 << 20))
