"""The Model class: a package loaded, its tokenizer and engine, and the methods that use them (load() in
__init__.py builds it). Its methods live beside it, one module per concern: generation.py (settings, prompts,
generate / stream / batch), messages.py (chat), scoring.py (score), saved_session.py (a conversation's key/value
cache saved to a file and restored).

Importing this module imports everything a Model's methods use (engine, batching, sampling, speculative, chat),
which load() does while the session's thread creates the onnxruntime session (session_start.py)."""

import threading

from ..batching.batch import Stream  # noqa: F401 (a public name: edgelm.runtime.Stream)
from ..batching import package_prefix
from ..batching.prefix_cache import PrefixCache, cache_bytes
from ..batching.prefix_store import DISK_DEFAULT_MB, disk_store
from ..engine import decode as engine_module
from ..engine.decode import Engine
from ..engine.embeddings import TokenEmbeddings
from ..engine.session import check_graph_shapes, drop_mapped_pages, graph_io, release_freed_memory
from ..errors import PackageError
from ..generation_defaults import generation_defaults
from ..package.format import GENERATION_CONFIG, MANIFEST
from ..package.open import Package
from ..text.chat_template import ChatTemplate
from .session_start import SessionStart, start_session, tokenizer_and_session
from .generation import Generation
from .messages import Chat
from .saved_session import SavedSession, Sessions  # noqa: F401 (SavedSession: a public name)
from .scoring import Score, Scoring  # noqa: F401 (Score: a public name)


class Model(Generation, Chat, Scoring, Sessions):
    """A loaded package: tokenizer, onnxruntime session, and the generation defaults it ships. Its methods come by
    concern: generate / stream / batch (generation.py), chat (messages.py), score (scoring.py), save_session /
    load_session (saved_session.py)."""

    def __init__(
        self, package: Package, device: str = "auto", threads: int | None = None, prefix_cache_mb=0, spinning=True,
        prefix_cache_dir=None, prefix_cache_disk_mb=DISK_DEFAULT_MB, session_start: SessionStart | None = None,
    ):  # fmt: skip
        """session_start: the package's session already being created (start_session, with the same device,
        threads and spinning), as load() starts it before importing this module; None starts it here. Its
        thread has ended whenever this returns or raises."""
        self.package, self.arch = package, package.arch
        try:  # a bad option fails before the session is used
            prefix_cache_bytes = cache_bytes(prefix_cache_mb)
            disk = disk_store(
                package, prefix_cache_dir, prefix_cache_disk_mb, prefix_cache_bytes, engine_module.PREFILL_CHUNK
            )
        except BaseException:
            if session_start is not None:
                session_start.abandon()
            raise
        start = session_start or start_session(package, device, threads, spinning)
        self.tokenizer, session, self.device = tokenizer_and_session(start)
        check_graph_shapes(session, package)
        graph = package.manifest.graph if package.manifest else None
        io = graph_io(session, self.arch.n_layer, bool(graph and graph.kv_cache_in_place))
        embeddings = None
        if io.takes_embeddings:
            if graph is None or graph.token_embeddings is None:
                raise PackageError(
                    f"{package.model_file} takes inputs_embeds, but {package.folder / MANIFEST} does not describe its token_embeddings; export the package again."
                )
            embeddings = TokenEmbeddings.open(package.path(graph.token_embeddings.file), graph.token_embeddings)
        self.engine = Engine(
            session,
            io,
            self.arch.kv_heads,
            self.arch.head_size,
            self.arch.vocab_size,
            self.device,
            embeddings,
            graph_file=package.model_file,
            prefix_cache=PrefixCache(prefix_cache_bytes, engine_module.PREFILL_CHUNK, disk) if prefix_cache_bytes else None,
            workers_spin=spinning,
        )
        package_prefix.seed(self.engine, package)  # the package's prompt cache, where it has one
        if disk is not None and self.engine.writes_cache_in_place:  # what the folder kept, read and checked now
            self.engine.prefix_cache.preload(self.engine.block_like)
        defaults_file = package.folder / GENERATION_CONFIG
        self.defaults = generation_defaults(package.generation_defaults, package.arch, defaults_file)
        self.pad_id = self.arch.pad_token_id if self.arch.pad_token_id is not None else (self.arch.eos_token_id or 0)
        self.chat_template = ChatTemplate.from_package(package)  # checked when first used, not here
        self._constraints = None  # the constraint compiler (sampling/constraint.py), made at the first constraint
        self._starts = {}  # conversation starts rendered (messages.py): their system messages' and tools' sha256 -> ids
        self._starts_lock = threading.Lock()
        self.draft = None  # a Model of the same tokenizer whose guesses speculative="draft" verifies (load(draft=))
        release_freed_memory()
        drop_mapped_pages(package.folder)
