"""Transparent huge pages for the memory onnxruntime prepacks the weights into (Linux, glibc 2.35 or later).

At load onnxruntime copies every int8 matrix into its own packed buffer (malloc'd), and each decode step
streams all of them once: every token walks the page tables for tens of thousands of 4 KiB pages.
glibc backs what malloc gets from the kernel with 2 MiB pages when the process starts with
GLIBC_TUNABLES=glibc.malloc.hugetlb=1 and the kernel's THP setting is `madvise` (the common default; with
`always` every process has them already). `edgelm bench` reports how much memory is on them (huge_pages_mb).

Only int8 packages get them: they decode faster with them, float32 packages gain nothing, and int4 packages
lose (MatMulNBits is not held back by the page walks, and the fresh 2 MiB pages it takes for its prompt buffers
cost). The figures are in benchmarks/NOTES.md.

glibc reads the tunable only when a process starts, so `edgelm serve` and `edgelm bench` on an int8 package
restart themselves once with it, first thing, and say so in one debug line on the "edgelm" logger (launch.py
says why not `generate`; EDGELM_HUGE_PAGES=0 turns it off). A program that embeds the runtime sets it in its
own environment.
"""

import os
import re
import sys
from pathlib import Path

from ..errors import PackageError
from ..package.open import read_manifest

TUNABLE = "glibc.malloc.hugetlb=1"
OPT_OUT = "EDGELM_HUGE_PAGES"  # "0": never restart the command for huge pages
THP_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")
RECIPES = ("int8", "int8-rows", "int8-dynamic")  # the weight recipes measured to gain (see above)


def thp_mode(setting: Path = THP_SETTING) -> str | None:
    """The kernel's transparent huge page mode ("always", "madvise", "never"), or None where there is none."""
    try:
        found = re.search(r"\[(\w+)\]", setting.read_text())
    except OSError:
        return None
    return found.group(1) if found else None


def libc_version() -> tuple[str, tuple[int, ...]]:
    """("glibc", (2, 36)) on glibc; ("", ()) elsewhere (musl, macOS, Windows)."""
    try:
        name, version = os.confstr("CS_GNU_LIBC_VERSION").split()
        return name, tuple(int(part) for part in version.split(".")[:2])
    except (AttributeError, ValueError, OSError):
        return "", ()


def environment_with_huge_pages(environ, platform: str, thp: str | None, libc: tuple) -> dict | None:
    """The environment to restart the command with, or None when a restart would change nothing."""
    if platform != "linux" or thp != "madvise" or environ.get(OPT_OUT) == "0":
        return None
    name, version = libc
    tunables = environ.get("GLIBC_TUNABLES", "")
    if name != "glibc" or version < (2, 35) or "glibc.malloc.hugetlb" in tunables:
        return None
    return {**environ, "GLIBC_TUNABLES": f"{tunables}:{TUNABLE}" if tunables else TUNABLE}


def gains(package_folder) -> bool:
    """Whether the package's weights are of a recipe that huge pages speed up (read from its manifest only)."""
    try:
        return read_manifest(Path(package_folder)).weights.method in RECIPES
    except PackageError:  # no package there, or not edgelm's: the load will say so
        return False


def restart_with_huge_pages(package_folder) -> None:
    """For the `edgelm` command about to load `package_folder`, before it imports anything heavy or reads
    stdin: run this same command line again, in this same process (exec), with the tunable set. Returns (and
    changes nothing) where that would not help."""
    if (
        getattr(sys, "frozen", False)
        or not sys.executable
        or not getattr(sys, "orig_argv", None)
        or not gains(package_folder)
    ):
        return
    environment = environment_with_huge_pages(os.environ, sys.platform, thp_mode(), libc_version())
    if environment is not None:
        import logging  # only here: the launcher imports nothing it does not need before the restart

        logging.getLogger("edgelm").debug(
            "restarting with GLIBC_TUNABLES=%s: huge pages for the int8 weights of %s",
            environment["GLIBC_TUNABLES"],
            package_folder,
        )
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            os.execve(sys.executable, sys.orig_argv, environment)
        except OSError:  # the interpreter cannot be started again: carry on with small pages
            return
