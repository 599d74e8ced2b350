"""Huge pages for the prepacked weights: when the `edgelm` command restarts itself with glibc's tunable, and
that the restart is real (runtime/hugepages.py)."""

import os
import subprocess
import sys
from importlib import metadata

import pytest

from edgelm.runtime import hugepages
from edgelm.runtime.hugepages import OPT_OUT, TUNABLE, environment_with_huge_pages

GLIBC = ("glibc", (2, 36))
VERSION = f"edgelm, version {metadata.version('edgelm')}"


def test_restarts_only_where_the_tunable_would_take_effect():
    assert environment_with_huge_pages({"PATH": "/bin"}, "linux", "madvise", GLIBC) == {"PATH": "/bin", "GLIBC_TUNABLES": TUNABLE}
    # other tunables are kept
    assert environment_with_huge_pages({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}, "linux", "madvise", GLIBC)["GLIBC_TUNABLES"] == f"glibc.malloc.arena_max=2:{TUNABLE}"
    for environ, platform, thp, libc in [
        ({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}, "linux", "madvise", GLIBC),  # the user chose: never override
        ({OPT_OUT: "0"}, "linux", "madvise", GLIBC),
        ({}, "linux", "always", GLIBC),  # every process has huge pages already
        ({}, "linux", "never", GLIBC),  # the kernel gives none
        ({}, "linux", None, GLIBC),
        ({}, "linux", "madvise", ("glibc", (2, 34))),  # the tunable came in glibc 2.35
        ({}, "linux", "madvise", ("", ())),  # musl
        ({}, "darwin", "madvise", GLIBC),
        ({}, "win32", None, ("", ())),
    ]:
        assert environment_with_huge_pages(environ, platform, thp, libc) is None, (environ, platform, thp, libc)


def test_thp_mode_reads_the_bracketed_setting(tmp_path):
    setting = tmp_path / "enabled"
    setting.write_text("always [madvise] never\n")
    assert hugepages.thp_mode(setting) == "madvise"
    assert hugepages.thp_mode(tmp_path / "absent") is None


RESTART = (
    "import os, sys\n"
    "print('GLIBC_TUNABLES=' + os.environ.get('GLIBC_TUNABLES', ''), flush=True)\n"
    "sys.argv = ['edgelm', '--version']\n"
    "from edgelm.runtime.cli import entry\n"
    "entry()\n"
)


@pytest.mark.parametrize("opt_out", [False, True])
def test_the_command_restarts_itself_once_with_the_tunable(opt_out):
    environ = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", OPT_OUT)} | ({OPT_OUT: "0"} if opt_out else {})
    expected = environment_with_huge_pages(environ, sys.platform, hugepages.thp_mode(), hugepages.libc_version())
    done = subprocess.run([sys.executable, "-c", RESTART], env=environ, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "GLIBC_TUNABLES="
    if expected is None:  # this machine (or the opt-out) gives nothing to restart for
        assert lines[1:] == [VERSION]
    else:  # the same process ran the command line again, now with the tunable, and went on to the command
        assert lines[1:] == [f"GLIBC_TUNABLES={TUNABLE}", VERSION]
    assert opt_out is False or expected is None


def test_the_command_imports_nothing_heavy_before_it_may_restart():
    code = "import sys, edgelm.runtime.cli; print(sorted(m for m in ('numpy', 'onnxruntime', 'tokenizers') if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "[]", done.stderr
    import edgelm.runtime as rt

    assert rt.load.__module__ == "edgelm.runtime.model" and "load" in dir(rt)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        rt.nope  # noqa: B018


def test_huge_page_memory_is_read_from_the_kernel():
    value = hugepages.huge_page_mb()
    assert value >= 0 if os.path.exists("/proc/self/smaps_rollup") else value is None  # Linux reports AnonHugePages
