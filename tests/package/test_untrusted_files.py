"""Every file from outside is read through runtime/untrusted.py: a regular file only (a FIFO, a device, a folder,
or a link to one is refused by what it is, and the open never waits), and never more than its bound. Here: the
signing key of `pack --sign`, a signature, the trusted-keys list, the verify cache's record, and random files in
their place."""

import os
import shutil
import signal
import tempfile
from contextlib import contextmanager
from pathlib import Path

import edgelm.runtime as rt
import minisign
import pytest
from edgelm.runtime import untrusted
from edgelm.runtime.errors import EdgelmError, StoreError
from edgelm.runtime.package import verified
from edgelm.runtime.store import signing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from store_support import assert_clean_failure, invoke

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo") or not hasattr(signal, "alarm"), reason="POSIX FIFOs")
FUZZ = settings(
    max_examples=40, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck)
)
KINDS = ["fifo", "link to a fifo", "/dev/zero", "link to /dev/zero", "folder", "missing", "dangling link", "big"]


class Hung(Exception):
    pass


@contextmanager
def bounded(seconds: int = 20):
    """Fail, rather than wait forever, if the block blocks (a FIFO opened or read) or never ends (/dev/zero)."""

    def hung(signum, frame):
        raise Hung(f"still reading after {seconds} s")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def place(path: Path, kind: str, data: bytes = b"") -> Path:
    """Put a file of `kind` (KINDS, or "bytes": a regular file of `data`) at `path`."""
    if kind == "bytes":
        path.write_bytes(data)
    elif kind == "big":
        with open(path, "wb") as f:
            f.truncate(64 << 20)  # sparse: 64 MiB of zeros, over every bound here
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "link to a fifo":
        os.mkfifo(path.with_name(path.name + ".fifo"))
        path.symlink_to(path.with_name(path.name + ".fifo"))
    elif kind in ("/dev/zero", "link to /dev/zero"):
        path.symlink_to("/dev/zero")
    elif kind == "folder":
        path.mkdir()
    elif kind == "dangling link":
        path.symlink_to(path.with_name("nowhere"))
    return path


@pytest.mark.parametrize("kind", KINDS)
def test_the_helper_refuses_what_is_not_a_bounded_regular_file(tmp_path, kind):
    path = place(tmp_path / "file", kind)
    with bounded(), pytest.raises(StoreError) as refused:
        untrusted.read_bytes(path, 1 << 20, StoreError, "; give another", what="a key")
    message = str(refused.value)
    assert message.endswith("; give another")
    expected = {"folder": "a folder", "big": "larger than a key may be", "missing": "cannot read"}
    if kind in ("fifo", "link to a fifo"):
        assert "not a regular file (it is a FIFO)" in message
    elif "zero" in kind:
        assert "not a regular file (it is a character device)" in message
    elif kind == "dangling link":
        assert "cannot read" in message
    else:
        assert expected[kind] in message


def test_the_helper_reads_a_regular_file_and_a_link_to_one(tmp_path):
    path = place(tmp_path / "file", "bytes", b"abc")
    (tmp_path / "link").symlink_to(path)
    assert untrusted.read_bytes(path, 3) == untrusted.read_bytes(tmp_path / "link", 3) == b"abc"
    with pytest.raises(EdgelmError, match=r"larger than a file of its kind may be \(2 bytes\)"):
        untrusted.read_bytes(path, 2)


@pytest.mark.parametrize("kind", ["/dev/zero", "fifo", "link to a fifo", "big"])
def test_pack_sign_with_a_key_that_is_not_a_key_file_is_one_line(tiny_package, tmp_path, store, kind):
    key = place(tmp_path / "secret.key", kind)
    with bounded():
        result = invoke("pack", tiny_package, "-o", tmp_path / "tiny.zip", "--sign", key)
    fragment = "larger than a minisign secret key may be" if kind == "big" else "not a regular file"
    assert_clean_failure(result, fragment)
    assert not (tmp_path / "tiny.zip.minisig").exists()


def _signed_archive(tiny_package, tmp_path):
    pair = minisign.KeyPair.generate()
    secret = tmp_path / "publisher.key"
    secret.write_bytes(b"untrusted comment: minisign secret key\n" + pair.secret_key.to_base64() + b"\n")
    archive = tmp_path / "tiny.zip"
    assert invoke("pack", tiny_package, "-o", archive, "--sign", secret).exit_code == 0
    return archive, pair.public_key.to_base64().decode()


def test_a_fifo_as_signature_or_trusted_key_list_is_refused_not_skipped(tiny_package, tmp_path, store):
    archive, public = _signed_archive(tiny_package, tmp_path)
    signature = archive.with_name(archive.name + signing.SUFFIX)
    signature.unlink()
    place(signature, "fifo")
    with bounded():
        assert_clean_failure(invoke("install", archive, "--trust", public), "not a regular file")
    signature.unlink()
    (store / ".meta").mkdir(exist_ok=True)
    place(store / ".meta" / signing.KEYS_FILE, "link to a fifo")  # once read as "no key trusted"
    with bounded():
        assert_clean_failure(invoke("install", archive), "not a regular file")
    assert not (store / "tiny").exists()


@pytest.mark.parametrize("kind", ["fifo", "link to a fifo", "/dev/zero", "big"])
def test_a_fifo_or_device_at_the_verify_cache_record_never_blocks_a_load(tiny_package, tmp_path, monkeypatch, kind):
    monkeypatch.setenv("EDGELM_CACHE", str(tmp_path / "cache"))
    package = Path(shutil.copytree(tiny_package, tmp_path / "pkg"))
    record = verified.record_path(package)
    record.parent.mkdir(parents=True)
    place(record, kind)
    with bounded():
        assert verified.read(package) == {}
        assert rt.load(package).generate("hi", max_new_tokens=2).token_ids  # hashed in full, then recorded
    assert verified.read(package)  # the record written over what was there


@FUZZ
@given(kind=st.sampled_from(["bytes", *KINDS]), data=st.binary(max_size=300))
def test_random_files_in_place_of_keys_signatures_and_cache_records(kind, data):
    """Whatever stands where a key, a signature, a key list or a cache record is read: a typed error or a value,
    never a hang, an endless read or an exception of another kind."""
    with tempfile.TemporaryDirectory() as folder, bounded():
        folder = Path(folder)
        archive = folder / "a.zip"
        archive.write_bytes(b"PK")
        key = place(folder / "secret.key", kind, data)
        with pytest.raises(StoreError):
            signing.sign(archive, key)
        listed = place(folder / "keys", kind, data)
        with pytest.raises(StoreError):
            signing.trusted_keys([str(listed)])
        signature = place(folder / "a.zip.minisig", kind, data)
        try:
            read = signing.read_signature(signature)
            assert read is None or isinstance(read, bytes)
        except StoreError:
            pass
        os.environ["EDGELM_CACHE"] = str(folder / "cache")
        try:
            package = folder / "pkg"
            package.mkdir()
            (folder / "cache").mkdir()
            place(verified.record_path(package), kind, data)
            assert verified.read(package) == {}
        finally:
            del os.environ["EDGELM_CACHE"]


@pytest.mark.parametrize("kind", ["fifo", "link to a fifo", "/dev/zero", "big"])
def test_a_fifo_or_device_among_the_stores_records_never_blocks_a_listing(tmp_path, store, kind):
    meta = store / ".meta"
    meta.mkdir(exist_ok=True)
    place(meta / "config.json", kind)  # which package is the default
    with bounded():
        result = invoke("list")
    assert result.exit_code == 0 and "Traceback" not in result.output, result.output


def test_stdin_is_read_up_to_one_prompts_bound(tiny_package, monkeypatch):
    """`edgelm generate -` reads at most what one line of a prompt file may hold (`< /dev/zero` ends there)."""
    from click.testing import CliRunner
    from edgelm.runtime.apps import prompt_file
    from edgelm.runtime.cli.main import main

    monkeypatch.setattr(prompt_file, "MAX_LINE_BYTES", 100)
    args = ["generate", "-m", str(tiny_package), "-", "--max-new-tokens", "2"]
    over = CliRunner().invoke(main, args, input="x" * 101)
    assert over.exit_code == 2 and "stdin holds over 100 bytes" in over.output and "Traceback" not in over.output
    assert CliRunner().invoke(main, args, input="hello").exit_code == 0
