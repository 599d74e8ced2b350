"""A package's onnxruntime session created on a thread while the loading thread goes on: the tokenizer's build,
and before it, in load(), the import of the Model's own modules (loaded.py)."""

import contextlib
import sys
import threading

from ..engine.session import create_session, release_freed_memory
from ..errors import PackageError
from ..package.onnxruntime_compat import check_installed
from ..package.open import Package, open_package
from ..text.tokenizer import load_tokenizer


class SessionStart:
    """A package's onnxruntime session being created on a thread (start_session, which starts it: begin), with the
    package's tokenizer.json read: tokenizer_and_session(start) builds the tokenizer and waits for the session;
    abandon() waits for the thread and drops what it made."""

    def __init__(self, package: Package, device: str, threads, spinning: bool):
        quantized = package.manifest is not None and package.manifest.weights.dtype != "float32"
        self.made, self.initializing = {}, threading.Event()
        self.tokenizer_file = package.tokenizer_file
        self.data = package.tokenizer_data()  # a file that cannot be read is refused before any session is made
        self.worker = threading.Thread(
            target=self._create, args=(package, device, threads, quantized, spinning), name="edgelm-onnxruntime-session"
        )
        self.folder = package.folder

    def begin(self) -> None:
        """Start the thread: apart from __init__, so that the caller holds the object before it runs (start_session)."""
        try:
            self.worker.start()
        except RuntimeError as error:  # no thread to be had (at the interpreter's exit, or a process at its limit)
            raise PackageError(f"cannot load {self.folder}: {error}") from None

    def _create(self, package: Package, device: str, threads, quantized: bool, spinning: bool) -> None:
        try:  # the onnxruntime check before onnxruntime sees the package
            with contextlib.suppress(Exception):  # refused (an audit hook): the build waits for the whole session
                sys.setprofile(_initializing(self.initializing))  # this thread's calls only
            check_installed(package.min_onnxruntime, f"the package {package.folder}", package.uses)
            self.made["session"] = create_session(package.model_file, device, threads, quantized, spinning)
        except BaseException as error:  # handed to the loading thread, which raises it
            self.made["error"] = error
        finally:
            self.initializing.set()
            with contextlib.suppress(Exception):
                sys.setprofile(None)

    def abandon(self) -> None:
        """Wait for the thread to end and drop the session it made, if any (a load that failed elsewhere)."""
        with contextlib.suppress(RuntimeError):  # a thread never started: nothing to wait for
            self.worker.join()
        self.made.clear()  # the session, if made, goes now rather than with a traceback
        self.data = None


def open_and_start(folder, verify, device: str, threads, spinning: bool) -> tuple[Package, SessionStart]:
    """(package, its session's start): the package at `folder` (resolved: store.resolve_package) opened and
    checked whole (manifest, checksums as `verify` asks, graph scan: open_package) before its session is started
    (start_session), the one way load() and the command's early start (cli/early.py) start one."""
    package = open_package(folder, verify=verify)  # checked whole before onnxruntime reads it
    return package, start_session(package, device, threads, spinning)


def start_session(package: Package, device: str, threads, spinning: bool) -> SessionStart:
    """Read the package's tokenizer.json, then start creating its session on a thread named
    edgelm-onnxruntime-session; the package was opened (manifest, checksums, graph scan) before this is called.
    An exit of this function other than its return (a Ctrl-C as the thread starts) waits for the thread."""
    start = SessionStart(package, device, threads, spinning)
    try:
        start.begin()
        return start
    except BaseException:
        start.abandon()
        raise


def tokenizer_and_session(start: SessionStart):
    """(tokenizer, onnxruntime session, the device it runs on): the tokenizer is built on this thread while
    start's thread creates the session. onnxruntime releases the GIL while it creates a session (on one core: it
    prepacks the weights one matrix at a time) and tokenizers holds it while it builds, so the session takes the
    other core for the whole build (benchmarks/NOTES.md, "Start:" rows). Errors come as if one ran after the other:
    the tokenizer's first, then the session's; the thread has ended whenever this returns or raises.

    onnxruntime releases the GIL twice, reading the graph and then initializing the session, with Python between
    the two: a build started before the second would hold that Python back, and the session with it, for the whole
    build. So the build waits until the thread calls initialize_session (_initializing), or has ended."""
    try:
        start.initializing.wait()  # set by the thread at initialize_session, or in its `finally` whatever happened
        data, start.data = start.data, None
        tokenizer = load_tokenizer(data, start.tokenizer_file)  # its UTF-8 checked here, beside the session
        del data
        # the build's freed memory back to the system before the session's peak, on the way to the first token (the
        # two threads end together): the session's thread allocates from its own malloc arena, which cannot reuse it
        release_freed_memory()
    except BaseException:
        start.abandon()
        raise
    start.worker.join()
    if "error" in start.made:
        raise start.made.pop("error")
    return (tokenizer, *start.made.pop("session"))


def _initializing(event: threading.Event):
    """A profile function (sys.setprofile) that sets `event` when its thread calls onnxruntime's
    InferenceSession.initialize_session, which releases the GIL until the session is made. Under another name in
    another onnxruntime nothing is set, and the tokenizer's build waits for the whole session: slower, not wrong."""

    def watch(frame, event_kind: str, called):
        if event_kind == "c_call" and getattr(called, "__name__", "") == "initialize_session":
            event.set()

    return watch
