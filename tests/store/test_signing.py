"""Origin: `edgelm pack --sign KEY` signs an archive in minisign's format and `edgelm install --trust PUBKEY`
(or the store's trusted-keys list) installs only what a trusted key signed: a tampered archive, another key's
signature or none at all is refused; minisign itself verifies what pack signs and edgelm verifies what
minisign signs; a download over plain HTTP with nothing checked gets a warning."""

import json
import os
import shutil
import subprocess

import minisign
import pytest
from fake_hub import FileServer
from store_support import assert_clean_failure, invoke, listing


def _key(tmp_path, name):
    """A minisign key pair, unencrypted: (secret key file, public key as minisign prints it)."""
    pair = minisign.KeyPair.generate()
    secret = tmp_path / f"{name}.key"
    secret.write_bytes(b"untrusted comment: minisign secret key\n" + pair.secret_key.to_base64() + b"\n")
    return secret, pair.public_key.to_base64().decode()


@pytest.fixture
def signed(tiny_package, tmp_path, store):
    secret, public = _key(tmp_path, "publisher")
    archive = tmp_path / "tiny.zip"
    result = invoke("pack", tiny_package, "-o", archive, "--sign", secret)
    assert result.exit_code == 0 and "signed:" in result.output, result.output
    assert (tmp_path / "tiny.zip.minisig").is_file()
    return archive, public


def test_a_signed_archive_installs_for_its_key_and_records_it(signed, store):
    archive, public = signed
    result = invoke("install", archive, "--trust", public, "--name", "tiny")
    assert result.exit_code == 0, result.output
    assert json.loads((store / ".meta" / "tiny.json").read_text())["signed_by"] == public


def test_a_tampered_archive_another_key_or_no_signature_is_refused(signed, store, tmp_path):
    archive, public = signed
    _, other = _key(tmp_path, "other")
    before = listing(store)
    assert_clean_failure(invoke("install", archive, "--trust", other), "not signed by a trusted key")
    tampered = tmp_path / "tampered.zip"
    data = bytearray(archive.read_bytes())
    data[len(data) // 2] ^= 1
    tampered.write_bytes(bytes(data))
    shutil.copy(archive.with_name("tiny.zip.minisig"), tmp_path / "tampered.zip.minisig")
    assert_clean_failure(invoke("install", tampered, "--trust", public), "not signed by a trusted key")
    archive.with_name("tiny.zip.minisig").unlink()
    assert_clean_failure(invoke("install", archive, "--trust", public), "is not signed")
    assert listing(store) == before


def test_the_stores_trusted_keys_apply_without_trust(signed, store, tmp_path):
    archive, public = signed
    (store / ".meta").mkdir(exist_ok=True)
    (store / ".meta" / "trusted-keys").write_text(f"# the fleet's publisher\n{public}\n")
    unsigned = tmp_path / "unsigned.zip"
    shutil.copy(archive, unsigned)
    assert_clean_failure(invoke("install", unsigned), "is not signed")
    assert invoke("install", archive, "--name", "tiny").exit_code == 0


def test_over_plain_http_unchecked_downloads_warn_and_signed_ones_verify(signed, store):
    archive, public = signed
    server = FileServer(archive.parent)
    try:
        url = f"{server.url}/{archive.name}"
        plain = invoke("install", url, "--name", "plain")
        assert plain.exit_code == 0 and "warning: " in plain.output and "plain HTTP" in plain.output
        checked = invoke("install", url, "--name", "checked", "--trust", public)
        assert checked.exit_code == 0 and "warning" not in checked.output, checked.output
    finally:
        server.stop()


@pytest.mark.skipif(
    shutil.which("minisign") is None and not os.environ.get("CI"),  # CI installs it (.ci/run): there it must run
    reason="minisign (apt-get install minisign) is not installed",
)
def test_minisign_verifies_what_pack_signs_and_install_trusts_what_minisign_signs(tiny_package, tmp_path, store):
    assert shutil.which("minisign"), "CI is set but minisign is missing: .ci/run installs Debian's minisign"
    key, pub = tmp_path / "m.key", tmp_path / "m.pub"
    subprocess.run(["minisign", "-G", "-W", "-p", pub, "-s", key], check=True, capture_output=True)
    archive = tmp_path / "tiny.zip"
    assert invoke("pack", tiny_package, "-o", archive, "--sign", key).exit_code == 0
    subprocess.run(["minisign", "-Vm", archive, "-p", pub], check=True, capture_output=True)
    (tmp_path / "tiny.zip.minisig").unlink()
    subprocess.run(["minisign", "-Sm", archive, "-s", key], check=True, capture_output=True)
    assert invoke("install", archive, "--trust", pub, "--name", "tiny").exit_code == 0
