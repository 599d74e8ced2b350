"""`edgelm pull`: a package from a hub-shaped endpoint on 127.0.0.1 (huggingface_hub honours HF_ENDPOINT), checked
against its manifest; every bad repo refused with one line, leaving the store as it was."""

import json

import pytest
from edgelm.runtime.package.open import open_package
from edgelm.runtime.store import local as store_module
from store_support import assert_clean_failure, invoke, listing, name_of

HUB_EXTRAS = {"README.md": b"# tiny\n", ".gitattributes": b"*.data filter=lfs\n"}


def test_pull_installs_under_the_manifest_name_and_records_the_commit(tiny_package, hub, store):
    repo = hub.add_folder("owner/tiny", tiny_package, extra=HUB_EXTRAS)
    result = invoke("pull", "owner/tiny")
    assert result.exit_code == 0, result.output
    installed = store / name_of(tiny_package)
    assert open_package(installed, verify=True).manifest == open_package(tiny_package).manifest
    assert sorted(p.name for p in installed.iterdir()) == sorted(p.name for p in tiny_package.iterdir())
    record = json.loads((store / ".meta" / f"{installed.name}.json").read_text())
    assert record["hub"] == "owner/tiny" and record["revision"] == "main" and record["commit"] == repo.sha
    assert {file for _, file, _ in repo.requests} == {p.name for p in tiny_package.iterdir()}  # no README fetched
    assert f"hf:owner/tiny@{repo.sha[:12]}" in invoke("list").output
    assert sorted(p.name for p in store.iterdir()) == [".meta", installed.name]  # no download folder left behind


def test_pull_a_revision_under_another_name(tiny_package_int8, hub, store):
    hub.add_folder("owner/tiny-int8", tiny_package_int8, revisions=("main", "v1"))
    result = invoke("pull", "owner/tiny-int8", "--revision", "v1", "--name", "mine")
    assert result.exit_code == 0, result.output
    open_package(store / "mine", verify=True)
    listed = invoke("list").output
    assert "mine" in listed and "int8 weights, float32 KV cache" in listed
    assert json.loads((store / ".meta" / "mine.json").read_text())["revision"] == "v1"
    assert_clean_failure(invoke("pull", "owner/tiny-int8", "--name", "mine"), "already installed")
    assert invoke("pull", "owner/tiny-int8", "--name", "mine", "--force").exit_code == 0


def test_an_interrupted_pull_resumes(tiny_package, hub, store, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "DOWNLOAD_CHUNK_SIZE", 4096)  # so a cut transfer leaves bytes
    repo = hub.add_folder("owner/tiny", tiny_package)
    repo.cut_short.add("model.onnx.data")
    before = listing(store)
    assert_clean_failure(invoke("pull", "owner/tiny"), "run the same command again to resume")
    assert listing(store, hidden=False) == before  # only the hidden download folder remains, for the resume
    repo.cut_short.clear()
    result = invoke("pull", "owner/tiny")
    assert result.exit_code == 0, result.output
    open_package(store / name_of(tiny_package), verify=True)
    ranges = [r for m, f, r in repo.requests if f == "model.onnx.data" and m == "GET"]
    assert ranges[-1] and ranges[-1] != "bytes=0-", ranges  # the second pull asked only for the rest


def pulled_fails(hub, store, files, fragment, *args):
    hub.add("owner/bad", files)
    before = listing(store)
    assert_clean_failure(invoke("pull", "owner/bad", *args), fragment)
    assert listing(store) == before


def test_a_repo_that_is_not_an_edgelm_package(hub, store):
    pulled_fails(hub, store, {"config.json": b"{}", "model.safetensors": b"x"}, "not an edgelm package")


def test_a_manifest_of_another_format(hub, store):
    pulled_fails(hub, store, {"manifest.json": b'{"format": "something-else"}'}, "not an edgelm package")


def test_a_repo_with_files_the_manifest_does_not_list(tiny_package, hub, store):
    files = {p.name: p.read_bytes() for p in tiny_package.iterdir()} | {"run_me.py": b"import os"}
    pulled_fails(hub, store, files, "run_me.py, which its manifest does not list")


def test_a_repo_missing_a_listed_file(tiny_package, hub, store):
    files = {p.name: p.read_bytes() for p in tiny_package.iterdir() if p.name != "tokenizer.json"}
    pulled_fails(hub, store, files, "lacks tokenizer.json")


def test_a_tampered_file_is_refused_and_not_kept(tiny_package, hub, store):
    files = {p.name: p.read_bytes() for p in tiny_package.iterdir()}
    files["tokenizer.json"] = b"[" + files["tokenizer.json"][1:]
    pulled_fails(hub, store, files, "does not match its sha256")


def test_a_manifest_listing_a_path_outside_the_folder(tiny_package, hub, store):
    manifest = json.loads((tiny_package / "manifest.json").read_text())
    manifest["files"]["../evil"] = {"size": 1, "sha256": "0" * 64}
    pulled_fails(hub, store, {"manifest.json": json.dumps(manifest).encode()}, "a plain file name")


def test_unknown_repo_revision_and_bad_ids(tiny_package, hub, store):
    hub.add_folder("owner/tiny", tiny_package)
    before = listing(store)
    assert_clean_failure(invoke("pull", "owner/absent"), "no repo owner/absent on the hub")
    assert_clean_failure(invoke("pull", "owner/tiny", "--revision", "v9"), "has no revision 'v9'")
    assert_clean_failure(invoke("pull", "not a repo!"), "not a hub repo id")
    assert_clean_failure(invoke("pull", "owner/tiny", "--name", "../x"), "not a valid package name")
    assert listing(store) == before


def test_offline_mode_and_an_unreachable_hub(tiny_package, hub, store, monkeypatch):
    import huggingface_hub.constants
    from huggingface_hub.utils import reset_sessions

    hub.add_folder("owner/tiny", tiny_package)
    before = listing(store)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # as HF_HUB_OFFLINE=1 at import
    reset_sessions()  # huggingface_hub reads it when it makes its HTTP session
    try:
        assert_clean_failure(invoke("pull", "owner/tiny"), "HF_HUB_OFFLINE is set")
    finally:
        monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
        reset_sessions()
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    assert_clean_failure(invoke("pull", "owner/tiny"), "cannot reach the hub at http://127.0.0.1:9")
    assert listing(store) == before


@pytest.mark.filterwarnings("ignore:Not enough free disk space")  # huggingface_hub's own warning, then ours
def test_too_little_disk_space(tiny_package, hub, store, monkeypatch):
    import shutil
    from collections import namedtuple

    hub.add_folder("owner/tiny", tiny_package)
    usage = namedtuple("Usage", "total used free")(1 << 30, 1 << 30, 1000)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage)
    before = listing(store)
    assert_clean_failure(invoke("pull", "owner/tiny"), "not enough disk space")
    assert listing(store) == before


def test_pull_library_call_returns_what_it_installed(tiny_package, hub, store):
    from edgelm.runtime.store.hub import pull

    hub.add_folder("owner/tiny", tiny_package)
    installed = pull("owner/tiny", name="lib")
    assert installed.folder == store / "lib" and installed.recipe == "float32 weights, float32 KV cache"
    assert store_module.resolve_package("lib") == store / "lib"
