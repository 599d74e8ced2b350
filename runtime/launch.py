"""The `edgelm` command's first step: restart with huge pages where that helps (hugepages.py), then run the
command (cli.py). It decides before click, NumPy, onnxruntime and tokenizers are imported, but a restart still
costs a second interpreter start: `edgelm generate` on the int8 package reached its first token in 1.02-1.09 s
against 0.98-1.00 s without it (12 rounds, alternating, twice), while decode runs 1.10x faster after. That pays
after ~130 tokens, so only the long-running commands restart: `serve`, and `bench` (which measures what serve
gets).
`generate` does not; give it GLIBC_TUNABLES=glibc.malloc.hugetlb=1 yourself for long outputs."""

import os
import sys

from .hugepages import restart_with_huge_pages
from .package import DEFAULT_PACKAGE
from .package_format import MANIFEST

RESTARTING_COMMANDS = ("serve", "bench")  # long-running: the restart's ~0.1 s is paid back many times


def package_to_load(args: list[str]):
    """The package folder a serve or bench command line will load, read without parsing it: the first argument
    that is a package folder (has a manifest.json), else the default package; None for the other commands."""
    if not args or args[0] not in RESTARTING_COMMANDS:
        return None
    return next((arg for arg in args[1:] if os.path.isfile(os.path.join(arg, MANIFEST))), DEFAULT_PACKAGE)


def command():
    package = package_to_load(sys.argv[1:])
    if package is not None:
        restart_with_huge_pages(package)
    from .cli import main

    main()
