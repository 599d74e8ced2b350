"""`edgelm pack` and `edgelm install`: one package as one zip file, from a file or a URL, and every hostile or
damaged archive refused with one line, leaving the store as it was."""

import errno
import hashlib
import json
import stat
import zipfile

import edgelm.runtime.store.archive as archive
import pytest
from edgelm.runtime.package.open import open_package
from fake_hub import FileServer
from store_support import assert_clean_failure, invoke, listing


@pytest.fixture(scope="module")
def packed(tiny_package, tmp_path_factory):
    """The tiny fp32 package packed once: (archive path, its sha256)."""
    folder = tmp_path_factory.mktemp("packed")
    result = archive.pack(tiny_package, folder / "tiny.zip")
    return result.path, result.sha256


@pytest.fixture
def served(tmp_path):
    server = FileServer(tmp_path / "www")
    server.folder.mkdir()
    yield server
    server.stop()


def members(path):
    with zipfile.ZipFile(path) as z:
        return {info.filename: z.read(info) for info in z.infolist()}


def rezip(path, entries, modes=None):
    """Write a zip of {name: bytes}; modes gives a member's unix mode (e.g. a symlink)."""
    with zipfile.ZipFile(path, "w") as z:
        for name, data in entries.items():
            info = zipfile.ZipInfo(name, (1980, 1, 1, 0, 0, 0))
            info.external_attr = (modes or {}).get(name, stat.S_IFREG | 0o644) << 16
            z.writestr(info, data)
    return path


def test_pack_writes_one_checksummed_zip_that_installs(tiny_package, packed, store, tmp_path):
    path, digest = packed
    top = json.loads((tiny_package / "manifest.json").read_text())["name"]
    assert set(members(path)) == {f"{top}/{n}" for n in ["manifest.json", *(p.name for p in tiny_package.iterdir())]}
    assert (path.parent / "tiny.zip.sha256").read_text() == f"{digest}  tiny.zip\n"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest

    result = invoke("install", path)
    assert result.exit_code == 0, result.output
    installed = store / top
    assert open_package(installed, verify=True).manifest == open_package(tiny_package).manifest
    assert {p.name for p in installed.iterdir()} == {p.name for p in tiny_package.iterdir()}
    listed = invoke("list")
    assert top in listed.output and "float32 weights, float32 KV cache" in listed.output and str(path) in listed.output


def test_pack_through_the_cli_is_reproducible(tiny_package, tmp_path):
    first = invoke("pack", tiny_package, "-o", tmp_path / "a.zip")
    second = invoke("pack", tiny_package, "-o", tmp_path / "b.zip")
    assert first.exit_code == 0 and second.exit_code == 0, first.output + second.output
    assert (tmp_path / "a.zip").read_bytes() == (tmp_path / "b.zip").read_bytes()
    assert hashlib.sha256((tmp_path / "a.zip").read_bytes()).hexdigest() in first.output
    assert_clean_failure(invoke("pack", tiny_package, "-o", tmp_path / "a.zip"), "--force")


def test_pack_refuses_a_damaged_package(tiny_package, tmp_path):
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    for p in tiny_package.iterdir():
        (damaged / p.name).write_bytes(p.read_bytes())
    (damaged / "tokenizer.json").write_bytes(b" " + (damaged / "tokenizer.json").read_bytes()[1:])
    assert_clean_failure(invoke("pack", damaged, "-o", tmp_path / "x.zip"), "sha256")
    assert not (tmp_path / "x.zip").exists()


def test_install_from_a_url_with_its_sha256(packed, store, served):
    path, digest = packed
    (served.folder / "tiny.zip").write_bytes(path.read_bytes())
    result = invoke("install", f"{served.url}/tiny.zip", "--sha256", digest, "--name", "from-web")
    assert result.exit_code == 0, result.output
    open_package(store / "from-web", verify=True)
    assert f"{served.url}/tiny.zip" in invoke("list").output


def test_install_twice_needs_force(packed, store):
    path, _ = packed
    assert invoke("install", path, "--name", "one").exit_code == 0
    before = listing(store)
    assert_clean_failure(invoke("install", path, "--name", "one"), "already installed")
    assert listing(store) == before
    result = invoke("install", path, "--name", "one", "--force")
    assert result.exit_code == 0, result.output
    assert [p.name for p in store.iterdir() if not p.name.startswith(".")] == ["one"]


def test_rm_and_unknown_names(packed, store):
    path, _ = packed
    invoke("install", path, "--name", "keep")
    before = listing(store)
    assert_clean_failure(invoke("rm", "nope"), "no package named 'nope' in the store")
    assert "Installed: keep" in invoke("rm", "nope").output
    assert_clean_failure(invoke("rm", "../keep"), "not a valid package name")
    assert listing(store) == before
    assert invoke("rm", "keep").exit_code == 0
    assert not (store / "keep").exists()
    assert "no packages in" in invoke("list").output


# --- bad archives: each one line, non-zero exit, the store as it was --------------------------------------


def hostile(packed, tmp_path, change):
    """The packed archive with its members changed by change(entries, top) -> entries (or (entries, modes))."""
    path, _ = packed
    entries = members(path)
    top = next(iter(entries)).split("/")[0]
    changed = change(dict(entries), top)
    entries, modes = changed if isinstance(changed, tuple) else (changed, None)
    return rezip(tmp_path / "bad.zip", entries, modes)


CASES = {
    "absolute path": (lambda e, t: e | {"/etc/evil": b"x"}, "outside its package folder"),
    "parent folder": (lambda e, t: e | {f"{t}/../evil": b"x"}, "outside its package folder"),
    "backslash": (lambda e, t: e | {f"{t}\\..\\evil": b"x"}, "outside its package folder"),
    "symlink": (
        lambda e, t: (e | {f"{t}/link": b"/etc/passwd"}, {f"{t}/link": stat.S_IFLNK | 0o777}),
        "symbolic link",
    ),
    "device": (lambda e, t: (e | {f"{t}/dev": b""}, {f"{t}/dev": stat.S_IFCHR | 0o644}), "not a regular file"),
    "fifo": (lambda e, t: (e | {f"{t}/fifo": b""}, {f"{t}/fifo": stat.S_IFIFO | 0o644}), "not a regular file"),
    "extra file": (lambda e, t: e | {f"{t}/run_me.py": b"print(1)"}, "which its manifest does not list"),
    "missing file": (lambda e, t: {k: v for k, v in e.items() if not k.endswith("tokenizer.json")}, "lacks"),
    "no manifest": (lambda e, t: {k: v for k, v in e.items() if not k.endswith("manifest.json")}, "no "),
    "two folders": (lambda e, t: e | {"other/x": b"x"}, "one package folder"),
    "subfolder": (lambda e, t: e | {f"{t}/sub/x": b"x"}, "not a file of one flat package folder"),
    "bigger than recorded": (
        lambda e, t: e | {f"{t}/tokenizer.json": e[f"{t}/tokenizer.json"] + b" " * 4096},
        "bytes in the archive but",
    ),
    "altered file": (
        lambda e, t: e | {f"{t}/tokenizer.json": b"[" + e[f"{t}/tokenizer.json"][1:]},
        "does not match its sha256",
    ),
    "not a manifest": (lambda e, t: e | {f"{t}/manifest.json": b'{"format": "other"}'}, "not an edgelm package"),
    "manifest lists a path": (
        lambda e, t: (
            e
            | {
                f"{t}/manifest.json": json.dumps(
                    json.loads(e[f"{t}/manifest.json"]) | {"files": {"../../evil": {"size": 1, "sha256": "0" * 64}}}
                ).encode()
            }
        ),
        "a plain file name",
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_hostile_archive_is_refused(case, packed, store, tmp_path):
    change, fragment = CASES[case]
    bad = hostile(packed, tmp_path, change)
    before = listing(store)
    assert_clean_failure(invoke("install", bad, "--name", "bad"), fragment)
    assert listing(store) == before
    assert not (tmp_path / "evil").exists()


def test_duplicate_member_is_refused(packed, store, tmp_path):
    path, _ = packed
    entries = members(path)
    top = next(iter(entries)).split("/")[0]
    bad = rezip(tmp_path / "dup.zip", entries)
    with pytest.warns(UserWarning), zipfile.ZipFile(bad, "a") as z:
        z.writestr(f"{top}/tokenizer.json", entries[f"{top}/tokenizer.json"])
    before = listing(store)
    assert_clean_failure(invoke("install", bad), "twice")
    assert listing(store) == before


def test_checksum_mismatch_and_truncated_file(packed, store, tmp_path):
    path, digest = packed
    before = listing(store)
    assert_clean_failure(invoke("install", path, "--sha256", "0" * 64), "not the expected")
    cut = tmp_path / "cut.zip"
    cut.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    assert_clean_failure(invoke("install", cut), "not a complete zip archive")
    (tmp_path / "cut.zip.sha256").write_text(f"{digest}  cut.zip\n")  # a sidecar beside a local file is checked
    assert_clean_failure(invoke("install", cut), "not the expected")
    assert_clean_failure(invoke("install", path, "--sha256", "xyz"), "not a sha256")
    assert_clean_failure(invoke("install", tmp_path / "nothing.zip"), "no archive at")
    assert_clean_failure(invoke("install", tmp_path), "is a folder; install takes one file")
    assert listing(store) == before


def test_truncated_or_missing_download_installs_nothing(packed, store, served):
    path, digest = packed
    (served.folder / "tiny.zip").write_bytes(path.read_bytes())
    served.cut_short.add("tiny.zip")
    before = listing(store)
    assert_clean_failure(invoke("install", f"{served.url}/tiny.zip"), "broke off")
    assert_clean_failure(invoke("install", f"{served.url}/absent.zip"), "404")
    assert_clean_failure(invoke("install", "http://127.0.0.1:9/tiny.zip"), "cannot download")
    assert listing(store) == before


def test_full_disk_leaves_the_store_as_it_was(packed, store, monkeypatch):
    path, _ = packed
    invoke("install", path, "--name", "first")
    before = listing(store)

    class FullDisk:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")

    real_open = open
    monkeypatch.setattr(
        archive,
        "open",
        lambda p, mode="r", *a: FullDisk(real_open(p, mode)) if "x" in mode else real_open(p, mode, *a),
        raising=False,
    )
    assert_clean_failure(invoke("install", path, "--name", "second"), "the disk filled up")
    assert listing(store) == before


def test_too_little_space_is_refused_before_extracting(packed, store, monkeypatch):
    import shutil
    from collections import namedtuple

    Usage = namedtuple("Usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: Usage(1 << 30, 1 << 30, 1000))
    before = listing(store)
    assert_clean_failure(invoke("install", packed[0]), "not enough disk space")
    assert listing(store) == before


def test_bad_names(packed, store):
    before = listing(store)
    for name in ("../evil", ".hidden", "a/b", "con", ""):
        assert_clean_failure(invoke("install", packed[0], "--name", name), "not a valid package name")
    assert listing(store) == before


def test_pack_onto_a_full_disk_leaves_no_file(tiny_package, tmp_path, monkeypatch):
    def full(path):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(archive, "sha256_file", full)
    assert_clean_failure(invoke("pack", tiny_package, "-o", tmp_path / "out.zip"), "No space left on device")
    assert list(tmp_path.iterdir()) == []


def test_a_package_that_needs_a_newer_onnxruntime_installs_nothing(packed, store, monkeypatch):
    """Installed, it could not run here: refused with the version to install, and the store is left as it was."""
    from edgelm.runtime.package import onnxruntime_compat

    monkeypatch.setattr(onnxruntime_compat, "installed_version", lambda: "1.21.0")
    before = listing(store)
    assert_clean_failure(invoke("install", packed[0], "--name", "too-new"), "needs onnxruntime 1.22 or newer")
    assert listing(store) == before
