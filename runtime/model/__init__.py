"""The public Python API: load a package once, then generate, stream and score text with it.

    model = edgelm.runtime.load("models/distilgpt2")
    print(model.generate("Hello, my name is", max_new_tokens=20).text)

A Model is immutable after load but for its prefix cache (load(..., prefix_cache_mb=N), runtime/batching/prefix_cache.py,
or the one load_session makes), which guards itself; any number of threads may call it at once (each call keeps its own state).

load() opens a package and starts creating its onnxruntime session on a thread (session_start.py); the Model class
and its methods live beside it (loaded.py), imported on first use: load() imports them while the session's thread
creates the session, so that a start pays for the Model's modules on the other core (benchmarks/NOTES.md, "Start:"
rows). This module imports only what opening a package and starting its session need.
"""

import os
from typing import TYPE_CHECKING

from ..batching.prefix_cache import cache_bytes
from ..batching.prefix_store import DISK_DEFAULT_MB
from ..errors import DeviceError, PackageError
from ..lazy import lazy_getattr
from ..package.open import Package
from ..store.local import resolve_package
from .session_start import SessionStart, open_and_start

if TYPE_CHECKING:
    from .loaded import Model

_LAZY = {  # the Model and the public names of its modules, imported on first use
    "Model": "loaded",
    "SavedSession": "loaded",
    "Score": "loaded",
    "Stream": "loaded",
}


__getattr__ = lazy_getattr(__name__, _LAZY, globals())


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
) -> "Model":
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
    package, start = open_and_start(resolve_package(path), verify, device, threads, spinning)
    model = model_of(package, start, device, threads, prefix_cache_mb, spinning, prefix_cache_dir, prefix_cache_disk_mb)
    if draft is not None:
        from ..speculative.draft import check_same_tokenizer

        draft_package, draft_start = open_and_start(resolve_package(draft), verify, device, threads, False)
        model.draft = model_of(draft_package, draft_start, device, threads, 0, False)
        check_same_tokenizer(model.package, model.draft.package)
    return model


def model_of(
    package: Package, start: SessionStart, device: str = "auto", threads: int | None = None, prefix_cache_mb=0,
    spinning: bool = True, prefix_cache_dir=None, prefix_cache_disk_mb=DISK_DEFAULT_MB,
) -> "Model":  # fmt: skip
    """The Model of an opened package whose session `start` is being created (start_session, given the same
    device, threads and spinning): the Model's own modules are imported now, while the session's thread runs. The
    thread has ended whenever this returns or raises."""
    try:
        from .loaded import Model
    except BaseException:
        start.abandon()
        raise
    return Model(
        package, device, threads, prefix_cache_mb, spinning, prefix_cache_dir, prefix_cache_disk_mb, session_start=start
    )
