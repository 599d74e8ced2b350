"""Huge pages for the prepacked weights: when the `edgelm` command restarts itself with glibc's tunable, and
that the restart is real (runtime/engine/hugepages.py)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from edgelm.runtime.engine import hugepages
from edgelm.runtime.engine.hugepages import OPT_OUT, TUNABLE, environment_with_huge_pages

GLIBC = ("glibc", (2, 36))


def test_restarts_only_where_the_tunable_would_take_effect():
    assert environment_with_huge_pages({"PATH": "/bin"}, "linux", "madvise", GLIBC) == {
        "PATH": "/bin",
        "GLIBC_TUNABLES": TUNABLE,
    }
    # other tunables are kept
    assert (
        environment_with_huge_pages({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}, "linux", "madvise", GLIBC)[
            "GLIBC_TUNABLES"
        ]
        == f"glibc.malloc.arena_max=2:{TUNABLE}"
    )
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
    "sys.argv = ['edgelm', 'bench', sys.argv[1], '--runs', '1', '--threads', '1', '--json']\n"
    "from edgelm.runtime.cli.launch import command\n"
    "command()\n"
)


def test_only_int8_packages_gain(tiny_package, tiny_package_int8, tiny_package_int4, tmp_path):
    assert hugepages.gains(tiny_package_int8)
    assert not hugepages.gains(tiny_package) and not hugepages.gains(tiny_package_int4)
    assert not hugepages.gains(tmp_path / "absent")
    (tmp_path / "manifest.json").write_text("{not json")
    assert not hugepages.gains(tmp_path)


@pytest.mark.parametrize(
    "fixture, opt_out",
    [  # the cases without a restart are also checked in-process above, so their subprocess runs are slow-tier
        ("tiny_package_int8", False),
        pytest.param("tiny_package_int8", True, marks=pytest.mark.slow),
        pytest.param("tiny_package", False, marks=pytest.mark.slow),
    ],
)
def test_the_command_restarts_itself_once_with_the_tunable(fixture, opt_out, request):
    package = request.getfixturevalue(fixture)
    environ = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", OPT_OUT)}
    machine = environment_with_huge_pages(environ, sys.platform, hugepages.thp_mode(), hugepages.libc_version())
    environ |= {OPT_OUT: "0"} if opt_out else {}
    done = subprocess.run(
        [sys.executable, "-c", RESTART, str(package)], env=environ, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    printed = done.stdout.splitlines()
    figures = json.loads("\n".join(line for line in printed if not line.startswith("GLIBC_TUNABLES=")))
    assert figures["package"] == str(package)  # the command ran once, to its end
    tunables = [line for line in printed if line.startswith("GLIBC_TUNABLES=")]
    if machine is not None and fixture == "tiny_package_int8" and not opt_out:
        # the same process ran the command line again, with the tunable
        assert tunables == ["GLIBC_TUNABLES=", f"GLIBC_TUNABLES={TUNABLE}"]
        assert figures["huge_pages_mb"] > 0  # and glibc did put memory on huge pages
    else:  # the opt-out, a float32 package, or a machine where it would change nothing: no restart
        assert tunables == ["GLIBC_TUNABLES="]


def test_the_command_line_names_the_package_it_will_load(tiny_package_int8, tmp_path, monkeypatch):
    from edgelm.runtime.cli.launch import package_to_load

    monkeypatch.chdir(tmp_path)
    package = Path(tiny_package_int8)
    assert package_to_load(["bench", str(package), "--runs", "1"]) == package
    assert package_to_load(["serve", "--port", "8001", str(package)]) == package
    assert package_to_load(["serve", str(tmp_path), str(package)]) == package  # a folder without a manifest is not one
    for option in (["-m", str(package)], ["--model", str(package)], [f"--model={package}"], [f"-m{package}"]):
        assert package_to_load(["serve", "--port", "8001", *option]) == package, option
    assert package_to_load(["bench"]) is None  # nothing to load here: the command itself says so
    # a store name, given or as the one installed package, is found the way the command finds it
    store = Path(os.environ["EDGELM_HOME"])
    shutil.copytree(package, store / "tiny8")
    for args in (["serve", "-m", "tiny8"], ["bench", "tiny8", "--runs", "1"], ["bench"]):
        assert package_to_load(args) == store / "tiny8", args
    # one-shot generation would pay the restart's start-up on every call; the others load no model
    for args in (
        ["generate", "Hello", "-m", str(package)],
        ["info", str(package)],
        ["verify", str(package)],
        ["export", "distilgpt2"],
        ["--help"],
        [],
    ):
        assert package_to_load(args) is None


def test_click_alone_never_restarts_its_host(tiny_package_int8):
    """In-process (click's runner, a program calling main) nothing may exec: only the command's launcher does."""
    from click.testing import CliRunner
    from edgelm.runtime.cli.main import main

    result = CliRunner().invoke(main, ["generate", "-m", str(tiny_package_int8), "--show-config"])
    assert result.exit_code == 0 and json.loads(result.output)["package"] == str(
        tiny_package_int8
    )  # still this process


def test_the_command_imports_nothing_heavy_before_it_may_restart():
    """launch.py decides before click, NumPy, onnxruntime or tokenizers are imported: a restart costs a bare start."""
    code = "import sys, edgelm.runtime.cli.launch; print(sorted(m for m in ('numpy', 'onnxruntime', 'tokenizers', 'click') if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "[]", done.stderr
    import edgelm.runtime as rt

    assert rt.load.__module__ == "edgelm.runtime.model" and "load" in dir(rt)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        rt.nope  # noqa: B018


def test_huge_page_memory_is_read_from_the_kernel(tmp_path):
    from edgelm.runtime.apps.bench import _proc_mb, huge_page_mb

    rollup = tmp_path / "smaps_rollup"
    rollup.write_text("Rss:               10240 kB\nAnonHugePages:      4096 kB\n")
    assert _proc_mb(str(rollup), "AnonHugePages") == 4.0  # kB to MB
    assert _proc_mb(str(rollup), "ShmemHugePages") is None
    assert _proc_mb(str(tmp_path / "absent"), "AnonHugePages") is None
    value = huge_page_mb()  # Linux reports AnonHugePages in /proc/self/smaps_rollup
    assert isinstance(value, float) if os.path.exists("/proc/self/smaps_rollup") else value is None
