"""The public Python API: load a package once, then generate, stream and score text with it.

    model = edgelm.runtime.load("models/distilgpt2")
    print(model.generate("Hello, my name is", max_new_tokens=20).text)

A Model is immutable after load but for its prefix cache (load(..., prefix_cache_mb=N), runtime/batching/prefix_cache.py,
or the one load_session makes), which guards itself; any number of threads may call it at once (each call keeps its own state).

This module builds a Model from a package (load, Model.__init__); its methods live beside it, one module per
concern: generation.py (settings, prompts, generate / stream / batch), messages.py (chat), scoring.py (score),
saved_session.py (a conversation's key/value cache saved to a file and restored).
"""

import contextlib
import os
import sys
import threading

from ..batching.batch import Stream  # noqa: F401 (a public name: edgelm.runtime.Stream)
from ..batching import package_prefix
from ..batching.prefix_cache import PrefixCache, cache_bytes
from ..batching.prefix_store import DISK_DEFAULT_MB, disk_store
from ..engine import decode as engine_module
from ..engine.decode import Engine
from ..engine.embeddings import TokenEmbeddings
from ..engine.session import check_graph_shapes, create_session, drop_mapped_pages, graph_io, release_freed_memory
from ..errors import DeviceError, PackageError
from ..generation_defaults import generation_defaults
from ..package.format import GENERATION_CONFIG, MANIFEST
from ..package.onnxruntime_compat import check_installed
from ..package.open import Package, open_package
from ..speculative.draft import check_same_tokenizer
from ..store.local import resolve_package
from ..text.chat_template import ChatTemplate
from ..text.tokenizer import load_tokenizer
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
        prefix_cache_dir=None, prefix_cache_disk_mb=DISK_DEFAULT_MB,
    ):  # fmt: skip
        self.package, self.arch = package, package.arch
        prefix_cache_bytes = cache_bytes(prefix_cache_mb)  # a bad option fails before anything is read
        disk = disk_store(package, prefix_cache_dir, prefix_cache_disk_mb, prefix_cache_bytes, engine_module.PREFILL_CHUNK)
        self.tokenizer, session, self.device = tokenizer_and_session(package, device, threads, spinning)
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


def tokenizer_and_session(package: Package, device: str, threads, spinning: bool):
    """(tokenizer, onnxruntime session, the device it runs on): the session is created on a thread while this one
    reads and builds the tokenizer. onnxruntime releases the GIL while it creates a session (on one core: it
    prepacks the weights one matrix at a time) and tokenizers holds it while it builds, so the session takes the
    other core for the whole build (benchmarks/NOTES.md, "Start:" rows). Errors come as if one ran after the other:
    the tokenizer's first, then the session's; the thread has ended whenever this returns or raises.

    onnxruntime releases the GIL twice, reading the graph and then initializing the session, with Python between
    the two: a build started before the second would hold that Python back, and the session with it, for the whole
    build. So the build waits until the thread calls initialize_session (_initializing), or has ended."""
    quantized = package.manifest is not None and package.manifest.weights.dtype != "float32"
    made, initializing = {}, threading.Event()

    def start_session():
        try:  # the onnxruntime check before onnxruntime sees the package
            with contextlib.suppress(Exception):  # refused (an audit hook): the build waits for the whole session
                sys.setprofile(_initializing(initializing))  # this thread's calls only
            check_installed(package.min_onnxruntime, f"the package {package.folder}", package.uses)
            made["session"] = create_session(package.model_file, device, threads, quantized, spinning)
        except BaseException as error:  # handed to the loading thread, which raises it
            made["error"] = error
        finally:
            initializing.set()
            with contextlib.suppress(Exception):
                sys.setprofile(None)

    text = package.tokenizer_text()  # a file that cannot be read is refused before any session is made
    worker = threading.Thread(target=start_session, name="edgelm-onnxruntime-session")
    try:
        worker.start()
    except RuntimeError as error:  # no thread to be had (at the interpreter's exit, or a process at its limit)
        raise PackageError(f"cannot load {package.folder}: {error}") from None
    try:
        initializing.wait()  # set by the thread at initialize_session, or in its `finally` whatever happened
        tokenizer = load_tokenizer(text, package.tokenizer_file)
        del text
        # the build's freed memory back to the system before the session's peak (this thread would wait anyway): the
        # session's thread allocates from its own malloc arena, which cannot reuse it
        release_freed_memory()
    except BaseException:
        worker.join()
        made.clear()  # the session, if made, goes now rather than with the traceback
        raise
    worker.join()
    if "error" in made:
        raise made.pop("error")
    return (tokenizer, *made.pop("session"))


def _initializing(event: threading.Event):
    """A profile function (sys.setprofile) that sets `event` when its thread calls onnxruntime's
    InferenceSession.initialize_session, which releases the GIL until the session is made. Under another name in
    another onnxruntime nothing is set, and the tokenizer's build waits for the whole session: slower, not wrong."""

    def watch(frame, event_kind: str, called):
        if event_kind == "c_call" and getattr(called, "__name__", "") == "initialize_session":
            event.set()

    return watch


def load(
    path=None,
    device: str = "auto",
    threads: int | None = None,
    verify: bool | str = True,
    prefix_cache_mb=0,
    spinning: bool = True,
    draft=None,
    prefix_cache_dir=None,
    prefix_cache_disk_mb=DISK_DEFAULT_MB,
) -> Model:
    """Open a package, check its files, and start a session on `device`. `path` is a package folder or the name of
    an installed package (edgelm list); None opens the default (store.resolve_package says which).

    verify: True checks each file against its sha256, hashing only the files changed since the last full check
    (package/verified.py); "full" hashes every file again; False skips the checksums.

    prefix_cache_mb: MiB of recent prompts' key/value rows to keep, so that a prompt starting with a recent
    prompt's first 128-token chunks skips computing them (a chat's history, a shared system prompt); outputs
    are identical with and without it. Off (0) by default: one prompt per process gains nothing from it, and it
    holds up to that memory. Used on CPU at batch 1 (runtime/batching/prefix_cache.py).

    draft: a smaller package (folder or installed name) of the same tokenizer, loaded beside this one, whose
    guesses generate() verifies several at a time (speculative "auto" or "draft": runtime/speculative/draft.py);
    a package of another tokenizer is refused. Its worker threads never spin: its passes alternate with this
    model's, whose pass would wait for the cores they spin on.

    prefix_cache_dir: a folder where the prefix cache's blocks are also written, at most prefix_cache_disk_mb MiB,
    so that a later process of the same package (its manifest's sha256) finds them (prefix_store.py); two
    processes may share it. Needs prefix_cache_mb > 0."""
    if path is not None and not isinstance(path, (str, os.PathLike)):
        raise PackageError(
            f"load() takes a package folder (a str or Path) or an installed package's name, got {type(path).__name__}"
        )
    cache_bytes(prefix_cache_mb)  # checked before the package is opened
    if not isinstance(spinning, bool):
        raise DeviceError(f"spinning must be True or False, got {str(spinning)[:40]}")
    if draft is not None and not isinstance(draft, (str, os.PathLike)):
        raise PackageError(f"draft= takes a package folder or an installed package's name, got {type(draft).__name__}")
    package = open_package(resolve_package(path), verify=verify)
    model = Model(package, device, threads, prefix_cache_mb, spinning, prefix_cache_dir, prefix_cache_disk_mb)
    if draft is not None:
        model.draft = Model(open_package(resolve_package(draft), verify=verify), device, threads, 0, False)
        check_same_tokenizer(model.package, model.draft.package)
    return model
