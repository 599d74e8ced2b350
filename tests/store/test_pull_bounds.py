"""`edgelm pull` bounds what it downloads as it streams, whatever the hub announces: a file stops at the first
byte past the size its manifest records, manifest.json at its limit, a stalled transfer after the stall timeout
and the whole pull at its deadline; each says one line and leaves no staging folder (a stalled package file's
folder stays, for the rerun to resume). Redirects to the hub's CDN keep working, without the token."""


import pytest
from edgelm.runtime.package.open import open_package
from edgelm.runtime.store import archive
from edgelm.runtime.store.local import MANIFEST_LIMIT
from store_support import assert_clean_failure, invoke, listing, name_of


@pytest.mark.parametrize("mode", ["long", "lying", "chunked"])
def test_a_file_longer_than_its_manifest_records_stops_at_the_first_extra_byte(tiny_package, hub, store, mode):
    repo = hub.add_folder("owner/tiny", tiny_package)
    repo.lies["model.onnx.data"] = mode  # listed at its true size, then sent with 8 MiB more
    before = listing(store)
    size = (tiny_package / "model.onnx.data").stat().st_size
    assert_clean_failure(invoke("pull", "owner/tiny"), f"more than {size:,} bytes for model.onnx.data")
    assert listing(store) == before  # no staging folder, no partial file


def test_an_oversize_manifest_streamed_without_a_length_stops_at_its_limit(tiny_package, hub, store):
    repo = hub.add_folder("owner/tiny", tiny_package)
    repo.lies["manifest.json"], repo.padding = "chunked", MANIFEST_LIMIT + 1  # valid JSON, one byte too long
    before = listing(store)
    assert_clean_failure(invoke("pull", "owner/tiny"), f"more than {MANIFEST_LIMIT:,} bytes for manifest.json")
    assert listing(store) == before


def test_a_stalled_transfer_stops_after_the_stall_timeout_and_resumes(tiny_package, hub, store, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(archive, "DOWNLOAD_STALL_S", 0.5)
    monkeypatch.setattr(huggingface_hub.constants, "DOWNLOAD_CHUNK_SIZE", 4096)  # so the stalled half is kept
    repo = hub.add_folder("owner/tiny", tiny_package)
    repo.lies["manifest.json"] = "stall"
    before = listing(store)
    assert_clean_failure(invoke("pull", "owner/tiny"), "sent no data for 0.5 s")
    assert listing(store) == before
    repo.lies = {"model.onnx.data": "stall"}
    assert_clean_failure(invoke("pull", "owner/tiny"), "sent no data for 0.5 s")
    assert listing(store, hidden=False) == before  # only the hidden download folder, for the rerun
    repo.lies = {}
    assert invoke("pull", "owner/tiny").exit_code == 0
    ranges = [r for m, f, r in repo.requests if f == "model.onnx.data" and m == "GET"]
    assert ranges[-1] and ranges[-1] != "bytes=0-", ranges  # the rerun asked only for the rest
    assert sorted(p.name for p in store.iterdir()) == [".meta", name_of(tiny_package)]


def test_a_pull_past_its_deadline_stops(tiny_package, hub, store, monkeypatch):
    monkeypatch.setattr(archive, "DOWNLOAD_DEADLINE_S", 0.0)
    hub.add_folder("owner/tiny", tiny_package)
    before = listing(store)
    assert_clean_failure(invoke("pull", "owner/tiny"), "took over 0 s")
    assert listing(store) == before


def test_a_redirect_to_the_cdn_is_followed_without_the_token(tiny_package, hub, store, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    repo = hub.add_folder("owner/tiny", tiny_package)
    repo.cdn = {"model.onnx.data", "model.onnx"}
    result = invoke("pull", "owner/tiny")
    assert result.exit_code == 0, result.output
    open_package(store / name_of(tiny_package), verify=True)
    assert sorted(set(repo.tokens)) == [("cdn", None), ("resolve", "Bearer hf_secret")]
