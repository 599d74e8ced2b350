"""Each Linux-only C library call has a portable path chosen by feature detection (runtime/engine/native.py);
EDGELM_PORTABLE=1 forces those paths, so they run here on Linux as they would on a system without the calls."""

import json
import os
import shutil

import edgelm.runtime as rt
import pytest
from edgelm.export import writer
from edgelm.runtime.engine import native, session
from edgelm.runtime.engine.hugepages import libc_version


@pytest.fixture
def portable(monkeypatch):
    monkeypatch.setenv(native.PORTABLE, "1")


def test_forced_portable_no_c_library_call_is_made(portable, tmp_path):
    assert native.c_function("malloc_trim") is None
    assert native.release_freed_memory() == ""
    assert native.bound_freed_heap() == ""
    assert session.drop_mapped_pages(tmp_path) == 0
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    assert writer._exchange(tmp_path / "a", tmp_path / "b") is False


def test_the_native_calls_are_found_on_glibc():
    if libc_version()[0] != "glibc":
        pytest.skip("the C library is not glibc: the portable paths are the ones in use")
    assert native.release_freed_memory() == "malloc_trim"
    assert native.bound_freed_heap() == "mallopt"
    assert native.c_function("renameat2") is not None


def test_a_forced_replace_by_two_renames_keeps_one_complete_package(portable, tiny_checkpoint, tmp_path):
    from edgelm.export.stages import export_model

    out = tmp_path / "out"
    export_model(str(tiny_checkpoint), out, validate=False)
    export_model(str(tiny_checkpoint), out, validate=False, force=True, quantize="int8")
    assert json.loads((out / "manifest.json").read_text())["weights"]["dtype"] == "int8"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no partial or replaced folder left
    assert rt.load(out).generate("Hi", max_new_tokens=3).token_ids


def test_a_package_runs_the_same_on_the_portable_paths(tiny_package, monkeypatch):
    native_tokens = rt.load(tiny_package).generate("Hello, my name is", max_new_tokens=8).token_ids
    monkeypatch.setenv(native.PORTABLE, "1")
    assert rt.load(tiny_package).generate("Hello, my name is", max_new_tokens=8).token_ids == native_tokens


class _FakeLibrary:
    """A C library with only the given functions, each recording its calls."""

    def __init__(self, **functions):
        self.functions, self.calls = functions, []

    def lookup(self, name, use_errno=False):
        if name not in self.functions:
            return None

        def call(*args):
            self.calls.append((name, args))
            return self.functions[name](*args)

        return call


def test_macos_pressure_relief_is_the_fallback_for_malloc_trim(monkeypatch):
    library = _FakeLibrary(malloc_zone_pressure_relief=lambda zone, goal: 0)
    monkeypatch.setattr(native, "c_function", library.lookup)
    assert native.release_freed_memory() == "malloc_zone_pressure_relief"
    assert library.calls == [("malloc_zone_pressure_relief", (None, 0))]


def test_macos_renamex_np_swaps_where_renameat2_is_missing(monkeypatch, tmp_path):
    def renamex_np(a, b, flags):  # what RENAME_SWAP does, for the test: the two names trade places
        assert flags == writer.RENAME_SWAP
        os.rename(a, a + b".swap")
        os.rename(b, a)
        os.rename(a + b".swap", b)
        return 0

    library = _FakeLibrary(renamex_np=renamex_np)
    monkeypatch.setattr(native, "c_function", library.lookup)
    for name in ("new", "old"):
        (tmp_path / name).mkdir()
        (tmp_path / name / name).touch()
    assert writer._exchange(tmp_path / "new", tmp_path / "old") is True
    assert (tmp_path / "old" / "new").exists() and (tmp_path / "new" / "old").exists()
    assert [name for name, _ in library.calls] == ["renamex_np"]
    shutil.rmtree(tmp_path / "new")
