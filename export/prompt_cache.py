"""The package's prompt cache (`edgelm export --system-prompt FILE [--tools FILE]`): the start every conversation
with that system prompt and those tools shares, rendered by the package's own chat template, prefilled once by
the runtime's engine on the package's own graph, and stored in the package (runtime/batching/package_prefix.py
says the file's format and how a conversation starts from it).

    render [system, user "a"] and [system, user "1"] -> the ids they share (the shared start, T tokens)
    -> prefilled alone, in passes of chunk (the last one ending at T), as any prompt that starts with it is
       (runtime/engine/passes.py: the prefill breaks at a known conversation start)
    -> prompt_cache.kv beside the package's files, then the manifest rewritten to list it (files, prompt_cache)
"""

import hashlib
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
from edgelm.runtime import untrusted
from edgelm.runtime.batching.package_prefix import prefix_bytes
from edgelm.runtime.batching.prefix_store import replace_atomically
from edgelm.runtime.engine import decode as engine_module
from edgelm.runtime.engine.passes import Starts
from edgelm.runtime.errors import EdgelmError
from edgelm.runtime.inputs import decode_utf8
from edgelm.runtime.package.format import MANIFEST, PROMPT_CACHE_FILE, FileRecord, PromptCacheRecord
from edgelm.runtime.package.open import file_record, open_package

from .errors import ExportError

MAX_SYSTEM_PROMPT_BYTES = 1 << 20  # far beyond any context a package has
MAX_TOOLS_BYTES = 4 << 20


def read_system_prompt(path) -> str:
    """The UTF-8 text of a --system-prompt file; ExportError for anything else."""
    text = _read_utf8(path, MAX_SYSTEM_PROMPT_BYTES, "a system prompt")
    if not text.strip():
        raise ExportError(f"{path} is empty; --system-prompt takes the system prompt's text.")
    return text


def read_tools(path) -> list:
    """A --tools file: a JSON list of OpenAI function tools ({"type": "function", "function": {"name", ...}})."""
    text = _read_utf8(path, MAX_TOOLS_BYTES, "a JSON file of tools")
    try:
        tools = json.loads(text)
    except (ValueError, RecursionError) as error:
        raise ExportError(f"{path} is not JSON ({error}); --tools takes a JSON list of OpenAI tools.") from None
    check_tools(tools, str(path))
    return tools


def _read_utf8(path, limit: int, what: str) -> str:
    """The file's text, refused rather than stored with replacement characters where it is not UTF-8."""
    data = untrusted.read_bytes(Path(path), limit, ExportError, what=what)
    try:
        return decode_utf8(data, str(path))
    except EdgelmError as error:
        raise ExportError(str(error)) from None


def check_tools(tools, where: str = "tools") -> None:
    if not isinstance(tools, list) or not tools:
        raise ExportError(f"{where} must be a non-empty JSON list of OpenAI tools ([{{\"type\": \"function\", ...}}]).")
    for k, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
            raise ExportError(f"{where}[{k}] is not an OpenAI function tool: it needs function.name.")


def shared_start(model, system_prompt: str, tools: list | None) -> list:
    """The token ids every conversation with this system prompt and these tools starts with, as `model`'s chat
    path renders them (Model.conversation_start): what two conversations of different first user messages share."""
    try:
        return model.conversation_start([{"role": "system", "content": system_prompt}], tools)
    except EdgelmError as error:
        raise ExportError(f"the package's chat template cannot render the system prompt: {error}") from None


def add_prompt_cache(folder, system_prompt: str, tools: list | None = None) -> PromptCacheRecord:
    """Prefill the start every conversation with `system_prompt` (and `tools`) shares on the package at `folder`
    and store its rows in the package, listed in its manifest; replaces a prompt cache it had."""
    from edgelm.runtime.model import load

    if tools is not None:
        check_tools(tools)
    model = load(folder, device="cpu", verify="full")
    model.engine.prefix_cache = None  # computed, never restored from a cache the package had
    model.engine.starts = Starts()  # nor broken at that cache's start: prefilled as a prompt of the start alone
    if not model.engine.writes_cache_in_place:
        raise ExportError(f"{folder}'s graph does not update its cache in place; export it again with edgelm export.")
    ids = shared_start(model, system_prompt, tools)
    chunk, context = engine_module.PREFILL_CHUNK, model.arch.n_positions
    if len(ids) >= context:  # no chat with it would fit: its start alone fills the context
        raise ExportError(
            f"the system prompt renders to a shared start of {len(ids)} tokens, which leaves no room for a message "
            f"in the model's {context}-token context; shorten it."
        )
    if not ids:
        raise ExportError(
            "the package's chat template renders no start that conversations with this system prompt share; there is "
            "nothing to store."
        )
    cached = len(ids)  # the whole start, in the passes a prefill of it alone makes
    decoder = model.engine.decoder(1, cached)
    decoder.run(np.asarray([ids[:cached]], dtype=np.int64), np.ones((1, cached), np.int64), np.arange(cached)[None])
    rows = tuple(buffer[0] for buffer in decoder.buffers)  # [KV, cached, D] per cache tensor
    manifest = model.package.manifest
    folder = Path(folder)
    _write(folder / PROMPT_CACHE_FILE, prefix_bytes(manifest, chunk, ids[:cached], rows))
    tools_json = json.dumps(tools, sort_keys=True, separators=(",", ":")).encode() if tools else None
    record = PromptCacheRecord(
        file=PROMPT_CACHE_FILE,
        tokens=cached,
        shared_tokens=len(ids),
        chunk=chunk,
        system_prompt_sha256=hashlib.sha256(system_prompt.encode()).hexdigest(),
        tools=tuple(t["function"]["name"] for t in tools or ()),
        tools_sha256=hashlib.sha256(tools_json).hexdigest() if tools_json else None,
    )
    files = manifest.files | {PROMPT_CACHE_FILE: FileRecord(**file_record(folder / PROMPT_CACHE_FILE))}
    text = json.dumps(replace(manifest, files=files, prompt_cache=record).to_dict(), indent=2, allow_nan=False)
    _write(folder / MANIFEST, (text + "\n").encode())
    open_package(folder, verify="full")  # reads back as written; recorded, so the first load need not hash it
    return record


def _write(path: Path, data: bytes) -> None:
    """`data` into `path` through a temporary file renamed into place: a reader sees the old file or the new."""
    try:
        replace_atomically(path, data)
    except OSError as error:
        raise ExportError(f"cannot write {path}: {error.strerror or error}.") from None
