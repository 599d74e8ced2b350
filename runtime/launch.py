"""The `edgelm` command's entry point, and `python -m edgelm.runtime.cli`'s: restart with huge pages where that
helps (hugepages.py), then run the command (cli.py).

It decides before click, NumPy, onnxruntime and tokenizers are imported, but a restart still costs a second
interpreter start, which the faster decode pays back only over many tokens (benchmarks/NOTES.md). So only the
long-running commands restart: `serve`, and `bench` (which measures what serve gets). `generate` does not; give
it GLIBC_TUNABLES=glibc.malloc.hugetlb=1 yourself for long outputs."""

import os
import sys

from .hugepages import restart_with_huge_pages
from .package import DEFAULT_PACKAGE
from .package_format import MANIFEST

RESTARTING_COMMANDS = ("serve", "bench")  # long-running: the restart's start-up is paid back many times


def package_to_load(args: list[str]):
    """The package folder a serve or bench command line will load, read without parsing it: the first argument
    that is a package folder (has a manifest.json), else the default package; None for the other commands."""
    if not args or args[0] not in RESTARTING_COMMANDS:
        return None
    return next((arg for arg in args[1:] if os.path.isfile(os.path.join(arg, MANIFEST))), DEFAULT_PACKAGE)


def command(main=None):
    """Run the command line in sys.argv; `main` is the click group when the caller has it imported already."""
    package = package_to_load(sys.argv[1:])
    if package is not None:
        restart_with_huge_pages(package)
    if main is None:
        from .cli import main

    main()
