"""A package is hashed in full once; later loads hash only the files whose identity (size, mtime, ctime, inode)
changed, and --verify / verify="full" hashes everything again. An altered file is found either way."""

import json
import os
import shutil

import edgelm.runtime as rt
import pytest
from click.testing import CliRunner
from edgelm.runtime.cli.main import main
from edgelm.runtime.package import open as package_open
from edgelm.runtime.package import verified


@pytest.fixture
def package(tiny_package, tmp_path):
    return shutil.copytree(tiny_package, tmp_path / "pkg")


@pytest.fixture
def hashed(monkeypatch):
    """The names of the files hashed, in order."""
    names = []
    real = package_open.sha256_of

    def counting(path, limit=None):
        names.append(path.name)
        return real(path, limit)

    monkeypatch.setattr(package_open, "sha256_of", counting)
    return names


def test_the_second_load_hashes_nothing_and_a_full_check_hashes_everything(package, hashed):
    files = set(json.loads((package / "manifest.json").read_text())["files"])
    rt.load(package)
    assert set(hashed) == files
    hashed.clear()
    rt.load(package)
    assert hashed == []
    rt.load(package, verify="full")
    assert set(hashed) == files


def test_a_rewritten_file_is_hashed_again_and_refused(package, hashed):
    rt.load(package)
    hashed.clear()
    data = bytearray((package / "tokenizer.json").read_bytes())
    data[10] ^= 1  # same size
    stat = (package / "tokenizer.json").stat()
    (package / "tokenizer.json").write_bytes(bytes(data))
    os.utime(package / "tokenizer.json", ns=(stat.st_atime_ns, stat.st_mtime_ns))  # mtime put back: ctime moves
    with pytest.raises(rt.PackageError, match="tokenizer.json does not match its sha256"):
        rt.load(package)
    assert hashed == ["tokenizer.json"]


def test_a_file_replaced_by_a_copy_is_hashed_again(package, hashed):
    rt.load(package)
    hashed.clear()
    shutil.copy2(package / "generation_config.json", package / "copy")
    os.replace(package / "copy", package / "generation_config.json")  # same bytes, mtime; new inode
    rt.load(package)
    assert hashed == ["generation_config.json"]


def test_a_damaged_record_is_ignored(package, hashed):
    rt.load(package)
    verified.record_path(package).write_text("{not json")
    hashed.clear()
    rt.load(package)
    assert len(hashed) > 1


def test_a_record_of_another_folder_is_not_used(package, tmp_path, hashed):
    rt.load(package)
    moved = tmp_path / "moved"
    os.rename(package, moved)  # same inodes, another path
    hashed.clear()
    rt.load(moved)
    assert len(hashed) > 1


def test_the_export_records_its_check(tiny_checkpoint, tmp_path, hashed):
    from edgelm.export.stages import export_model

    export_model(str(tiny_checkpoint), tmp_path / "fresh", validate=False)
    hashed.clear()
    rt.load(tmp_path / "fresh")
    assert hashed == []


def test_the_command_line_flags(package, hashed):
    runner = CliRunner()
    ran = runner.invoke(main, ["generate", "-m", str(package), "Hi", "--max-new-tokens", "2"])
    assert ran.exit_code == 0, ran.output
    hashed.clear()
    ran = runner.invoke(main, ["generate", "-m", str(package), "Hi", "--max-new-tokens", "2", "--verify"])
    assert ran.exit_code == 0 and len(hashed) > 1, ran.output
    both = runner.invoke(main, ["generate", "-m", str(package), "Hi", "--verify", "--no-verify"])
    assert both.exit_code == 2 and "--verify and --no-verify contradict each other" in both.output
    hashed.clear()
    checked = runner.invoke(main, ["verify", str(package)])
    assert checked.exit_code == 0 and len(hashed) > 1  # edgelm verify always hashes every file


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_a_bad_verify_value_is_one_clear_error(package, value):
    with pytest.raises(rt.PackageError, match="verify must be True, False or 'full'"):
        rt.load(package, verify=value)
