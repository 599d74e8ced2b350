"""A package's prompt cache: the key/value rows of the conversation start that every chat with the export's
system prompt (and tools) shares, prefilled once at export (`edgelm export --system-prompt`) and stored in the
package, so that a new conversation prefills only what follows it.

The file (manifest: prompt_cache.file, listed in `files` with its sha256, so that verification and signing cover
it) is one block of prefix_store.py's format holding the rows of the whole start (an older export's: its whole
prefill chunks):

    EDGELMKV1\\n  {"package": graph_identity, "chunk", "tokens": [ids], "arrays": [[dtype, [KV, T, D]], ...],
                  "sha256"}\\n  the rows' bytes: one array per cache tensor, in the decoder's order
                  (layer 0 key, layer 0 value, layer 1 key, ...), in the graph's cache dtype (int8 for an int8 cache)

At load, seed() pins those rows in the engine's prefix cache (prefix_cache.py), which restores them into any
prompt that starts with the same token ids, and makes the start one the prefill breaks its passes at
(runtime/engine/passes.py): a prompt that starts with it is prefilled, cold or warm, in the passes of the start
alone and then from the start's end. As there, the rows are the bits a cold prefill computes (the same graph, in
the same passes), and the outputs are identical. The rows are bound to the graph and its weights (their sha256),
not to the manifest, which lists the file itself.
"""

import hashlib

from ..engine import decode as engine_module
from ..errors import PackageError
from ..inputs import is_token_id
from . import prefix_store
from .prefix_cache import PrefixCache

AGAIN = "Export the package again with --system-prompt."


def graph_identity(manifest) -> str:
    """What the rows depend on: the graph and every file it reads, by their sha256 in the manifest."""
    graph = manifest.graph
    names = [graph.file, graph.weights_file, graph.token_embeddings.file if graph.token_embeddings else None]
    digest = hashlib.sha256(graph.kv_cache_dtype.encode())
    for name in dict.fromkeys(n for n in names if n is not None):
        digest.update(f";{name}:{manifest.files[name].sha256}".encode())
    return digest.hexdigest()


def prefix_bytes(manifest, chunk: int, tokens, rows: tuple) -> bytes:
    """The prompt cache file's bytes: the rows [KV, T, D] (one per cache tensor) a prefill of `tokens` wrote."""
    return prefix_store.block_bytes(graph_identity(manifest), chunk, tokens, rows)


def read_prefix(package, engine) -> tuple[list, tuple] | None:
    """(token ids, rows) of the package's prompt cache, checked whole against its manifest and the graph; None for
    a package without one. PackageError when the file is not the one the manifest describes."""
    record = package.manifest.prompt_cache if package.manifest is not None else None
    if record is None:
        return None
    path = package.path(record.file)
    header = prefix_store.read_header(path) or {}
    tokens = header.get("tokens")
    vocab = package.arch.vocab_size
    if (
        not isinstance(tokens, list)
        or len(tokens) != record.tokens
        or not all(is_token_id(t, vocab) for t in tokens)
    ):
        raise PackageError(f"{path} does not hold the {record.tokens} token ids its manifest records. {AGAIN}")
    like = engine.block_like(record.tokens)  # shapes and dtype only: read_block compares them with the file's
    rows = prefix_store.read_block(path, graph_identity(package.manifest), record.chunk, tokens, like)
    if rows is None:
        raise PackageError(
            f"{path} is not the prompt cache of this graph (its rows, their shape or dtype, or its checksum differ "
            f"from what the package's graph makes). {AGAIN}"
        )
    return tokens, rows


def seed(engine, package) -> None:
    """Pin the package's prompt cache in `engine`'s prefix cache (made, bounded at 0 bytes of its own, where the
    engine has none). Nothing for a package without one, or where the prefix cache does not serve: a graph whose
    cache is not written in place (another device), or a runtime whose prefill chunk differs from the export's."""
    record = package.manifest.prompt_cache if package.manifest is not None else None
    if record is None or not engine.writes_cache_in_place or record.chunk != engine_module.PREFILL_CHUNK:
        return
    tokens, rows = read_prefix(package, engine)
    if engine.prefix_cache is None:
        engine.prefix_cache = PrefixCache(0, record.chunk)
    engine.prefix_cache.pin(tokens, rows)
    engine.starts.add(tokens, pinned=True)
