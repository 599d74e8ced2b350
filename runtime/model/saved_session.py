"""A conversation's key/value cache saved to a file and restored in a later process, so that the conversation goes
on without computing its saved prefix again.

    messages.append({"role": "assistant", "content": model.chat(messages).text})
    model.save_session("chat.session", messages)           # after a turn: the messages and their rows
    ...
    saved = model.load_session("chat.session")             # a later process, the same package
    reply = model.chat([*saved.messages, {"role": "user", "content": "And then?"}])

The file is one record of the prefix cache's on-disk format (runtime/batching/prefix_store.py: MAGIC, a JSON header
line, the rows), read through the same checks. Its header binds it to the package (the manifest's sha256) and to
the token ids the rows are of, holds the messages (and tools) those ids were rendered from, and has a sha256 of its
own beside the rows'. The rows are those of the conversation's prefill passes that a cache keeps (whole, or ending at
its conversation start: runtime/engine/passes.py, whose break the header's "start" records), the bits a cold prefill
computes (runtime/batching/prefix_cache.py says why only those). load_session puts them in the model's prefix
cache, so the next prompt that starts with those tokens, a chat or a generate, copies them in instead of computing
them, with the output of a cold start.

Where the engine does not write its cache in place (CUDA, a package exported without the in-place graph) the file
holds the conversation alone, and a resumed conversation computes its prefix again.
"""

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import untrusted
from ..batching.prefix_cache import CLI_DEFAULT_MB, PrefixCache
from ..batching.prefix_store import MAGIC, package_identity, read_record, record_bytes, replace_atomically
from ..engine import decode as engine_module
from ..engine.decode import InPlaceDecoder
from ..engine.passes import kept_end
from ..errors import SessionError
from ..inputs import is_token_id

KIND = "edgelm-session"  # the header's "kind": what tells a saved session from a prefix-cache block
MAX_HEADER = 8 << 20  # bytes of a session's header: its token ids, messages and tools
ADVICE = "; resume from a file that save_session (edgelm chat --session) wrote, or delete it to start anew"
UNSIGNED = ("arrays", "sha256", "header_sha256")  # the header's keys its own sha256 does not cover


@dataclass(frozen=True)
class SavedSession:
    """A conversation that save_session wrote or load_session restored."""

    messages: list | None  # the chat messages saved; None for a session of token ids
    token_ids: list  # what the rows are of: the messages rendered (no reply opened), or the ids given
    cached_tokens: int  # the first token_ids whose rows the file holds, put in the prefix cache (within its bound)
    tools: list | None = None  # the OpenAI function tools the messages were rendered with


class Sessions:
    """Model.save_session() and Model.load_session()."""

    def save_session(self, path, conversation, *, tools=None) -> SavedSession:
        """Write `conversation` (chat messages as chat() takes them, or a list of token ids) and the key/value
        rows of its kept prefill passes to `path`, replacing an earlier session there through a temporary file
        renamed into place. The rows come from the prefix cache where it holds them (a chat turn's prompt just
        prefilled), else are computed once. A file at `path` that is not a saved session is refused."""
        _check_path(path)
        messages, ids = self._session_ids(conversation, tools)
        if messages is not None:
            self.mark_conversation_start(messages, tools, ids)
        chunk, start = self._session_chunk(), self.engine.starts.longest(ids)
        # the passes a later prompt can start with: within the context, one position left for its next pass
        kept = kept_end(min(len(ids), self.arch.n_positions - 1), chunk, start)
        cached = kept if self.engine.writes_cache_in_place else 0
        rows = self._prefix_rows(ids, cached, start)  # the start the header names: looked up once
        header = {
            "kind": KIND,
            "package": package_identity(self.package, "a saved session"),
            "chunk": chunk,
            "start": start if cached else 0,  # where the rows' passes broke (runtime/engine/passes.py)
            "tokens": ids,
            "cached_tokens": cached,
            "messages": messages,
            "tools": tools,
        }
        try:
            header["header_sha256"] = _digest(header)
        except (TypeError, ValueError) as error:
            raise SessionError(f"the conversation cannot be saved as JSON ({error})") from None
        data = record_bytes(header, rows)
        if data.index(b"\n", len(MAGIC)) - len(MAGIC) > MAX_HEADER:
            raise SessionError(
                f"the conversation is over {MAX_HEADER:,} bytes of messages and tokens: too large to save"
            )
        _check_replaceable(path)
        try:
            replace_atomically(Path(path), data)
        except OSError as error:
            raise SessionError(f"cannot write {path}: {error.strerror or error}") from None
        return SavedSession(messages, ids, cached, tools)

    def load_session(self, path) -> SavedSession:
        """The conversation saved in `path` (by save_session, of this package), its key/value rows put in this
        model's prefix cache (one is made, of at least CLI_DEFAULT_MB MiB, where load() was given none), so that
        a prompt starting with its token_ids skips their prefill. SessionError of one line for a file of another
        package, altered, truncated, too large or not a regular file."""
        _check_path(path)
        engine, chunk = self.engine, self._session_chunk()
        per_token = (
            engine.cache_tensors * engine.kv_heads * engine.head_size * np.dtype(engine.io.cache_dtype).itemsize
        )
        limit = MAX_HEADER + self.arch.n_positions * per_token
        header, rows = read_record(path, limit, SessionError, ADVICE, "a saved session", MAX_HEADER)
        tokens, cached = header.get("tokens"), header.get("cached_tokens")
        if header.get("kind") != KIND:
            raise SessionError(f"{path} is not a saved session (a prefix-cache block?){ADVICE}")
        if header.get("package") != package_identity(self.package, "a saved session"):
            raise SessionError(
                f"{path} was saved with another package than {self.package.folder} (or another export of it): "
                "resume it with that package, or delete it to start a new conversation"
            )
        if header.get("header_sha256") != _digest({k: v for k, v in header.items() if k not in UNSIGNED}):
            raise SessionError(f"{path} was altered: its header does not match its sha256{ADVICE}")
        if header.get("chunk") != chunk:
            raise SessionError(
                f"{path} holds rows of {header.get('chunk')}-token passes, this runtime makes {chunk}{ADVICE}"
            )
        if not _session_fields(header, self.arch.vocab_size, self.arch.n_positions, chunk) or header["arrays"] != (
            [[np.dtype(engine.io.cache_dtype).str, [engine.kv_heads, cached, engine.head_size]]]
            * engine.cache_tensors
            if cached
            else []
        ):
            raise SessionError(f"{path} does not hold a conversation of this package's shape{ADVICE}")
        restored = cached if engine.writes_cache_in_place else 0
        if restored:
            room = max(CLI_DEFAULT_MB << 20, 2 * sum(r.nbytes for r in rows))
            if engine.prefix_cache is None:
                engine.prefix_cache = PrefixCache(room, chunk)
            elif engine.prefix_cache.max_bytes == 0:  # only a package's pinned prompt cache (package_prefix.py)
                engine.prefix_cache.max_bytes = room
            # [H, cached, D] per cache tensor, seen as the [1, H, capacity, D] buffers a prefill leaves
            start = header.get("start", 0)
            engine.prefix_cache.store(np.asarray(tokens[:cached], dtype=np.int64), start, [r[None] for r in rows])
            engine.starts.add(tokens[:start])  # the resumed conversation's prefill breaks where the saved one's did
        return SavedSession(header.get("messages"), tokens, restored, header.get("tools"))

    def _session_chunk(self) -> int:
        cache = self.engine.prefix_cache
        return cache.chunk if cache is not None else engine_module.PREFILL_CHUNK

    def _session_ids(self, conversation, tools) -> tuple:
        """(messages or None, token ids) of a conversation given as chat messages or as token ids."""
        if isinstance(conversation, (list, tuple)) and conversation and all(isinstance(m, dict) for m in conversation):
            messages = [dict(m) for m in conversation]
            text = self.chat_template.render(messages, add_generation_prompt=False, tools=tools)
            ids = self.encode(text, add_special_tokens=False)
        elif (
            isinstance(conversation, (list, tuple))
            and conversation
            and tools is None
            and not any(isinstance(m, dict) for m in conversation)
        ):
            messages, ids = None, list(conversation)
            self._check_ids(ids)
            ids = [int(i) for i in ids]
        else:
            raise SessionError(
                "save_session takes a conversation: chat messages ([{'role': 'user', 'content': ...}, ...], with "
                f"tools= if any) or a non-empty list of token ids, got {type(conversation).__name__}"
            )
        return messages, ids

    def _prefix_rows(self, ids: list, cached: int, start: int) -> list:
        """The key/value rows of ids' first `cached` tokens, one [H, cached, D] array per cache tensor: a batch-1
        prefill in the prefix cache's chunks, which copies in the chunks the cache holds and computes the rest,
        one position past them so that none is computed again."""
        if not cached:
            return []
        run = np.asarray([ids[: cached + 1]], dtype=np.int64)  # [1, T]
        decoder = InPlaceDecoder(self.engine, 1, run.shape[1], self.engine.prefix_cache)
        decoder.run(run, np.ones_like(run), np.arange(run.shape[1])[None], start)
        return [buffer[0, :, :cached].copy() for buffer in decoder.buffers]


def _digest(header: dict) -> str:
    return hashlib.sha256(json.dumps(header, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _session_fields(header: dict, vocab_size: int, n_positions: int, chunk: int) -> bool:
    """Whether a header's conversation is well formed for this model: token ids of its vocabulary, kept passes
    cached within its context, messages and tools as JSON lists."""
    tokens, cached = header.get("tokens"), header.get("cached_tokens")
    return (
        isinstance(tokens, list)
        and tokens
        and all(is_token_id(t, vocab_size) for t in tokens)
        and isinstance(cached, int)
        and not isinstance(cached, bool)
        and 0 <= cached <= min(len(tokens), n_positions - 1)
        and _count(header.get("start", 0), len(tokens))
        and cached == kept_end(cached, chunk, header.get("start", 0))
        and (header.get("messages") is None or _dicts(header["messages"]))
        and (header.get("tools") is None or isinstance(header["tools"], list))
    )


def _count(value, most: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= most


def _dicts(value) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(m, dict) for m in value)


def _check_path(path) -> None:
    if not isinstance(path, (str, os.PathLike)):
        raise SessionError(f"a session's path must be a file's path (a str or Path), got {type(path).__name__}")
    if not str(path):
        raise SessionError("a session's path is empty: name the file to save the conversation in")


def _check_replaceable(path) -> None:
    """Refuse to replace a file that is not a saved session (edgelm writes only what it made): a missing file, or
    one that starts as this format does, may be written."""
    if not os.path.lexists(path):
        return
    try:
        with untrusted.open_regular(path, SessionError, "; give the path of a new file or of a saved session") as f:
            start = f.read(len(MAGIC))
    except OSError as error:
        raise SessionError(f"cannot read {path}: {error.strerror or error}") from None
    if start != MAGIC:
        raise SessionError(f"{path} holds something other than a saved session; give the path of a new file")
