"""The `edgelm` command's entry point, and `python -m edgelm.runtime.cli`'s: restart with huge pages where that
helps (hugepages.py), then run the command (cli.py).

It decides before click, NumPy, onnxruntime and tokenizers are imported, but a restart still costs a second
interpreter start, which the faster decode pays back only over many tokens (benchmarks/NOTES.md). So only the
long-running commands restart: `serve`, and `bench` (which measures what serve gets). `generate` does not; give
it GLIBC_TUNABLES=glibc.malloc.hugetlb=1 yourself for long outputs. `generate -m NAME_OR_PATH` instead opens its
package and starts creating its session before click and the command's modules are imported (early.py); a Ctrl-C
before click runs gets what click gives one while it runs: `Aborted!`, exit status 1.

Once the command is done, the process ends without tearing the interpreter down (exit_now): Python would free
every module, the tokenizer and the session's packed weights one object at a time, which the system does at once
when the process ends (benchmarks/NOTES.md, "Start:" rows). A session the early start is still creating (a usage
error ended the command) ends with the process, not waited for."""

import atexit
import os
import sys
from pathlib import Path

from ..errors import EdgelmError

RESTARTING_COMMANDS = ("serve", "bench")  # long-running: the restart's start-up is paid back many times


def package_to_load(args: list[str]):
    """The package folder a serve or bench command line will load, read without parsing it (click is not imported
    yet): the value of -m/--model, else the first argument that names a package (a package folder or an installed
    name), else the default, each resolved as the command will (store.resolve_package). None for the other
    commands, and where nothing resolves (the command itself then says why)."""
    if not args or args[0] not in RESTARTING_COMMANDS:
        return None
    from ..store.local import names_a_package, resolve_package
    from .early import model_argument

    given = model_argument(args)
    if given is None:
        given = next((arg for arg in args[1:] if not arg.startswith("-") and names_a_package(arg)), None)
    try:
        return resolve_package(given)
    except EdgelmError:
        return None


def use_bundled_store() -> None:
    """In a folder made by `edgelm bundle` (a frozen command in DIR/edgelm/), the package store is DIR/models
    unless EDGELM_HOME names another: the bundle's package is the one commands use when no -m is given."""
    if getattr(sys, "frozen", False) and "EDGELM_HOME" not in os.environ:
        store = Path(sys.executable).resolve().parent.parent / "models"
        if store.is_dir():
            os.environ["EDGELM_HOME"] = str(store)


def command(main=None):
    """Run the command line in sys.argv; `main` is the click group when the caller has it imported already."""
    use_bundled_store()
    try:  # the engine package first checks that this CPU runs the installed onnxruntime (one line, not a SIGILL)
        from ..engine.hugepages import restart_with_huge_pages
    except EdgelmError as error:
        sys.exit(f"Error: {error}")
    package = package_to_load(sys.argv[1:])
    if package is not None:
        restart_with_huge_pages(package)
    early = None
    try:
        from .early import start

        early = start(sys.argv[1:])  # generate's session, started before click and the command's modules are imported
        if main is None:
            from .main import main

        main(obj=early)
    except KeyboardInterrupt:  # a Ctrl-C before click ran the command (click catches one while it runs)
        print("Aborted!", file=sys.stderr)
        exit_now(1, early)
        raise SystemExit(1) from None
    except SystemExit as done:
        exit_now(done.code, early)  # a command that loaded nothing (a usage error): its session is not waited for
        raise
    finally:
        if early is not None:  # where Python ends the process itself: the thread ends first
            early.abandon()


def exit_now(code, early=None) -> None:
    """End the process with exit status `code` (None or an int: a message to print is left to Python) after what
    an exit must do: the atexit functions run (logging's flush among them) and stdout and stderr flushed. Returns,
    leaving the exit to Python, while another Python thread runs (a server's, a constraint compiler's: Python
    joins or stops them first) or where the output cannot be flushed (a closed pipe: Python reports it). The
    thread of `early` (an EarlyStart) is not waited for: its session, still being created, ends with the process."""
    import threading

    session = early.session_start.worker if early is not None else None
    others = [t for t in threading.enumerate() if t is not threading.current_thread() and t is not session]
    if not (code is None or isinstance(code, int)) or others:
        return
    atexit._run_exitfuncs()  # what Python runs at exit before it frees the modules; each runs once
    try:
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
    except (OSError, ValueError):
        return
    os._exit(code or 0)
