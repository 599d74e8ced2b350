"""`edgelm bundle -o DIR --force` replaces only a folder an earlier bundle made (it holds the mark bundle writes
first), and never an empty name (the current folder), a link, the current or home folder, a folder that holds the
package or one inside it; each refusal is one line and leaves everything as it was. Nothing here builds: the
checks come before the environment is made, which these tests stop at."""

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from edgelm.runtime.apps import bundle
from edgelm.runtime.apps.bundle import MARK, MARK_TEXT, BundleError, build_bundle
from edgelm.runtime.cli.main import main
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

FUZZ = settings(
    max_examples=40, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck)
)


class Stopped(BundleError):
    """Raised where the build would start making its environment (needs PyPI): every check has passed."""


@pytest.fixture
def no_build(monkeypatch):
    def stop(work, log):
        raise Stopped("stopped before building")

    monkeypatch.setattr(bundle, "_environment", stop)


def listing(folder: Path) -> list:
    return sorted((str(p.relative_to(folder)), p.is_file() and p.read_bytes()) for p in folder.rglob("*"))


def invoke(*args):
    return CliRunner().invoke(main, ["bundle", *map(str, args)])


def refused(result, fragment):
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    assert "Traceback" not in result.output and result.output.count("\n") == 1
    assert fragment in result.output, result.output


@pytest.fixture
def package(tiny_package, tmp_path):
    """The package in a folder of its own, beside a notes file: what a user's models folder holds."""
    models = tmp_path / "models"
    models.mkdir()
    (models / "notes.txt").write_text("mine")
    return Path(shutil.copytree(tiny_package, models / "tiny"))


@pytest.mark.parametrize(
    "where, fragment",
    [
        (lambda p: p.parent, "holds the package"),  # the folder holding the package
        (lambda p: p, "holds the package"),  # the package itself
        (lambda p: p / "bundle", "inside it"),
        (lambda p: "", 'empty (-o "")'),  # an unset variable in a script
        (lambda p: Path("."), "current"),
        (lambda p: Path("~"), "home"),
    ],
)
def test_force_never_replaces_the_package_its_folder_or_the_current_or_home_folder(
    package, tmp_path, monkeypatch, no_build, where, fragment
):
    home = tmp_path / "home"  # the current folder and the home folder, holding a user's work
    home.mkdir()
    (home / "thesis.tex").write_text("years of work")
    monkeypatch.chdir(home)
    monkeypatch.setenv("HOME", str(home))
    before = listing(tmp_path)
    refused(invoke("-m", package, "-o", where(package), "--force"), fragment)
    assert listing(tmp_path) == before


def test_force_replaces_no_folder_without_the_mark(package, tmp_path, no_build):
    out = tmp_path / "dist"
    out.mkdir()
    (out / "thesis.tex").write_text("years of work")
    before = listing(out)
    refused(invoke("-m", package, "-o", out, "--force"), f"has no {MARK}")
    (out / MARK).symlink_to(out / "thesis.tex")  # a mark must be the file bundle writes, not a link
    refused(invoke("-m", package, "-o", out, "--force"), f"has no {MARK}")
    (out / MARK).unlink()
    assert listing(out) == before


@pytest.mark.parametrize("target", ["full", "empty"])
def test_an_output_that_is_a_link_is_one_line(package, tmp_path, no_build, target):
    real = tmp_path / "real"
    real.mkdir()
    if target == "full":
        (real / "keep").write_text("x")
    link = tmp_path / "link"
    link.symlink_to(real)
    refused(invoke("-m", package, "-o", link, "--force"), "is a symbolic link")
    assert listing(real) == ([("keep", b"x")] if target == "full" else [])


def test_force_replaces_a_folder_a_bundle_made_and_the_mark_comes_first(package, tmp_path, no_build):
    out = tmp_path / "dist"
    with pytest.raises(Stopped):
        build_bundle(package, out)
    assert listing(out) == [(MARK, MARK_TEXT.encode())]  # written before the build, kept when it fails
    (out / "old-bundle-file").write_text("from the last build")
    refused(invoke("-m", package, "-o", out), "pass --force")
    with pytest.raises(Stopped):
        build_bundle(package, out, force=True)
    assert listing(out) == [(MARK, MARK_TEXT.encode())]


ENTRY = st.tuples(st.sampled_from(["a", "b", "sub/c", MARK, f"sub/{MARK}"]), st.binary(max_size=80))


@FUZZ
@given(entries=st.lists(ENTRY, max_size=4), mark=st.sampled_from(["none", "good", "other text", "link", "folder"]))
def test_random_folders_in_place_of_the_output_are_replaced_only_when_a_bundle_made_them(
    package, no_build, entries, mark
):
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "out"
        out.mkdir()
        for name, data in entries:
            (out / name).parent.mkdir(parents=True, exist_ok=True)
            if not (out / name).is_dir():
                (out / name).write_bytes(data)
        if (out / MARK).exists() or (out / MARK).is_symlink():
            (out / MARK).unlink()
        if mark == "good":
            (out / MARK).write_text(MARK_TEXT)
        elif mark == "other text":
            (out / MARK).write_text(MARK_TEXT + "x")
        elif mark == "link":
            os.symlink(Path(folder) / "elsewhere", out / MARK)
            (Path(folder) / "elsewhere").write_text(MARK_TEXT)
        elif mark == "folder":
            (out / MARK).mkdir()
        before = listing(out)
        with pytest.raises(BundleError) as stopped:
            build_bundle(package, out, force=True)
        if mark == "good":
            assert isinstance(stopped.value, Stopped) and listing(out) == [(MARK, MARK_TEXT.encode())]
        elif before:
            assert not isinstance(stopped.value, Stopped) and listing(out) == before
