"""The store itself: where it lives, names, list / rm / default, resolve_package (a path, a store name, or the
default), atomic installs, and `edgelm export --name`."""

import json
import os
import shutil

import pytest
from edgelm.runtime.errors import PackageError, StoreError
from edgelm.runtime.package.open import open_package
from edgelm.runtime.store import local as st
from store_support import assert_clean_failure, invoke, listing


def install_copy(package, name, source=None):
    """Install a package folder the way pull and install do: fill a staging folder, then install_folder."""
    with st.staging() as work:
        shutil.copytree(package, work / "package")
        return st.install_folder(work / "package", name, source or {"archive": "test"})


def test_store_location(monkeypatch, tmp_path):
    monkeypatch.delenv("EDGELM_HOME", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert st.store_dir() == tmp_path / "xdg" / "edgelm" / "models"
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert st.store_dir() == tmp_path / "home" / ".local" / "share" / "edgelm" / "models"
    monkeypatch.setattr(st.sys, "platform", "win32")
    monkeypatch.setenv("LOCALAPPDATA", str(tmp_path / "local"))
    assert st.store_dir() == tmp_path / "local" / "edgelm" / "models"
    monkeypatch.setenv("EDGELM_HOME", str(tmp_path / "mine"))
    assert st.store_dir() == tmp_path / "mine"


@pytest.mark.parametrize("name", ["tiny", "distilgpt2-int8-kv8", "GPT_2.v1", "a"])
def test_good_names(name):
    assert st.check_name(name) == name


@pytest.mark.parametrize("name", ["", ".", "..", "../x", "a/b", "a\\b", ".hidden", "-x", "a b", "x" * 101, "NUL", "x."])
def test_bad_names(name):
    with pytest.raises(StoreError, match="not a valid package name"):
        st.check_name(name)


def test_install_list_default_rm(tiny_package, tiny_package_int8, store):
    install_copy(tiny_package, "fp32", {"hub": "owner/tiny", "revision": "main", "commit": "a" * 40})
    install_copy(tiny_package_int8, "int8")
    result = invoke("list")
    assert result.exit_code == 0, result.output
    rows = {line.split()[0]: line for line in result.stdout.splitlines()[1:]}
    assert "float32 weights, float32 KV cache" in rows["fp32"] and f"hf:owner/tiny@{'a' * 12}" in rows["fp32"]
    assert "int8 weights, float32 KV cache" in rows["int8"] and " MB" in rows["int8"]

    assert_clean_failure(invoke("default", "nope"), "no package named 'nope'")
    assert "none set" in invoke("default").stdout
    assert invoke("default", "int8").exit_code == 0
    assert invoke("default").stdout == "default package: int8\n"
    assert "int8 *" in invoke("list").stdout
    assert st.resolve_package() == store / "int8"
    assert invoke("rm", "int8").exit_code == 0
    assert st.get_default() is None  # removing the default clears it
    assert st.resolve_package() == store / "fp32"  # the one installed package
    assert not (store / ".meta" / "int8.json").exists()
    (store / "fp32" / "manifest.json").write_text("{")
    assert "damaged (unreadable manifest): edgelm rm fp32" in invoke("list").stdout


def test_resolve_a_path_or_a_store_name(tiny_package, store, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert st.resolve_package(tiny_package) == tiny_package  # an existing path is a path
    assert st.resolve_package(str(tiny_package)) == tiny_package
    install_copy(tiny_package, "tiny")
    assert st.resolve_package("tiny") == store / "tiny"
    (tmp_path / "tiny").mkdir()
    assert st.resolve_package("tiny") == tmp_path.joinpath("tiny").relative_to(tmp_path)  # a folder here wins
    with pytest.raises(PackageError, match="no package by that name in the store. Installed: tiny"):
        st.resolve_package("other")
    with pytest.raises(PackageError, match="no model package at missing/folder"):
        st.resolve_package("missing/folder")


def test_resolve_with_nothing_given(tiny_package, store, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    nothing = r"no model package on this machine \(no default set, none installed in .*, no models/distilgpt2 here\)"
    with pytest.raises(PackageError, match=nothing + r"\. Get one with: edgelm pull REPO") as error:
        st.resolve_package()
    assert "edgelm export distilgpt2" in str(error.value)  # the tests have the export extra
    install_copy(tiny_package, "one")
    install_copy(tiny_package, "two")
    with pytest.raises(PackageError, match=r"2 packages are installed \(one, two\).*edgelm default NAME"):
        st.resolve_package()
    (tmp_path / "models" / "distilgpt2").mkdir(parents=True)
    assert st.resolve_package() == st.DEFAULT_PACKAGE  # today's default, when it exists
    st.set_default("two")
    assert st.resolve_package() == store / "two"
    shutil.rmtree(store / "two")  # removed behind the store's back
    with pytest.raises(PackageError, match="the default package 'two' is no longer installed"):
        st.resolve_package()


def test_how_to_get_one_offers_export_only_where_it_works(monkeypatch):
    real = st.importlib.util.find_spec
    monkeypatch.setattr(st.importlib.util, "find_spec", lambda name: None if name == "torch" else real(name))
    message = st.how_to_get_one()
    assert "edgelm pull REPO" in message and "edgelm install FILE_OR_URL" in message
    assert "export" not in message


def test_an_install_is_atomic(tiny_package, store, monkeypatch):
    """A failure at the final rename leaves the old package in place and nothing half-installed."""
    install_copy(tiny_package, "tiny")
    before = listing(store)
    real_rename = os.rename

    def failing_rename(src, dst):
        if str(src).startswith(str(store / st.TEMP)):
            raise OSError(5, "Input/output error")
        return real_rename(src, dst)

    monkeypatch.setattr(st.os, "rename", failing_rename)
    with pytest.raises(StoreError, match="cannot write to the store"):
        with st.staging() as work:
            shutil.copytree(tiny_package, work / "package")
            st.install_folder(work / "package", "tiny", {"archive": "second"}, force=True)
    assert listing(store) == before
    open_package(store / "tiny", verify=True)


def test_a_folder_with_an_unlisted_or_linked_file_is_refused(tiny_package, store, tmp_path):
    with st.staging() as work:
        shutil.copytree(tiny_package, work / "package")
        (work / "package" / "extra.py").write_text("print(1)")
        with pytest.raises(PackageError, match="not listed in the package's manifest"):
            st.install_folder(work / "package", "x", {})
        (work / "package" / "extra.py").unlink()
        (work / "package" / "tokenizer.json").unlink()
        (work / "package" / "tokenizer.json").symlink_to(tiny_package / "tokenizer.json")
        with pytest.raises(PackageError, match="not a regular file"):
            st.install_folder(work / "package", "x", {})
    assert listing(store) == []  # the staging folder is gone too


def test_dead_installs_are_swept(store):
    leftover = store / f"{st.TEMP}999999999-abc"
    leftover.mkdir()
    with st.staging():
        pass
    assert not leftover.exists()


def test_export_name_sets_the_package_name(tiny_checkpoint, tmp_path):
    from edgelm.export.stages import export_model

    result = export_model(str(tiny_checkpoint), tmp_path / "folder", validate=False, name="my-model")
    assert json.loads((result.path / "manifest.json").read_text())["name"] == "my-model"
    assert open_package(result.path).name == "my-model"
    with pytest.raises(StoreError, match="not a valid package name"):
        export_model(str(tiny_checkpoint), tmp_path / "other", validate=False, name="../evil")
    assert "--name" in invoke("export", "--help").output
