"""One way to name a package in every command: -m/--model NAME_OR_PATH, a store name or a folder, resolved the
same way by every command and by load(); a prompt that names a package is refused; an installed package answers
to its store name."""

import json
import zipfile
from pathlib import Path

import click
import edgelm.runtime as rt
import pytest
from click.testing import CliRunner
from edgelm.runtime import PackageError
from edgelm.runtime.cli.main import main
from edgelm.runtime.cli.options import HELP

PACKAGE_COMMANDS = ("generate", "chat", "info", "verify", "bench", "serve", "pack")


def invoke(*args, input=None):
    return CliRunner().invoke(main, [str(a) for a in args], input=input)


def assert_fails(result, fragment, code=1):
    assert result.exit_code == code, result.output
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert fragment in result.output and "Traceback" not in result.output, result.output


@pytest.fixture
def installed(tiny_package, tmp_path):
    """tiny_package packed and installed into the (empty, per-test) store as "tiny"."""
    archive = tmp_path / "tiny.zip"
    assert invoke("pack", tiny_package, "-o", archive).exit_code == 0
    result = invoke("install", archive, "--name", "tiny")
    assert result.exit_code == 0, result.output
    return "tiny"


def test_every_package_command_has_the_same_option():
    for name in PACKAGE_COMMANDS:
        command = main.get_command(None, name)
        options = [p for p in command.params if isinstance(p, click.Option) and p.name == "package"]
        assert len(options) == 1, name
        assert options[0].opts == ["-m", "--model"] and options[0].help == HELP, name
        assert options[0].metavar == "NAME_OR_PATH", name


def test_a_store_name_works_in_every_command(installed, tiny_package, tmp_path, model):
    expected = model.generate("Hi", max_new_tokens=4).text + "\n"
    assert invoke("generate", "-m", installed, "Hi", "--max-new-tokens", 4).stdout == expected
    assert invoke("generate", "--model", installed, "Hi", "--max-new-tokens", 4).stdout == expected
    for args in (["info", "-m", installed], ["info", installed], ["verify", "--model", installed]):
        result = invoke(*args)
        assert result.exit_code == 0 and installed in result.output, (args, result.output)
    chat = invoke("chat", "-m", installed, "--max-new-tokens", 3, input="Hello\n")
    assert chat.exit_code == 0, chat.output
    bench = invoke("bench", "-m", installed, "--runs", 1, "--threads", 1, "--json")
    assert bench.exit_code == 0, bench.output
    assert Path(json.loads(bench.stdout)["package"]).name == installed
    packed = invoke("pack", "-m", installed, "-o", tmp_path / "again.zip")
    assert packed.exit_code == 0, packed.output
    assert rt.load(installed).generate("Hi", max_new_tokens=4).text == expected[:-1]  # the Python API too


def test_an_unknown_name_is_one_clear_line_everywhere(installed):
    for args in (
        ["generate", "-m", "nope", "Hi"],
        ["chat", "-m", "nope"],
        ["info", "-m", "nope"],
        ["verify", "nope"],
        ["bench", "-m", "nope"],
        ["serve", "-m", "nope"],
        ["pack", "-m", "nope"],
    ):
        assert_fails(invoke(*args), "Installed: tiny")
    with pytest.raises(PackageError, match="no package by that name in the store. Installed: tiny"):
        rt.load("nope")


def test_the_default_package(installed, tiny_package, tmp_path, monkeypatch, model):
    monkeypatch.chdir(tmp_path)
    expected = model.generate("Hi", max_new_tokens=4).text + "\n"
    assert invoke("generate", "Hi", "--max-new-tokens", 4).stdout == expected  # the one installed package
    assert invoke("pack", tiny_package, "-o", tmp_path / "b.zip").exit_code == 0
    assert invoke("install", tmp_path / "b.zip", "--name", "other").exit_code == 0
    assert_fails(invoke("generate", "Hi"), "edgelm default NAME")  # two installed, none chosen
    assert_fails(invoke("info"), "2 packages are installed (other, tiny)")
    assert invoke("default", "other").exit_code == 0
    assert invoke("generate", "Hi", "--max-new-tokens", 4).stdout == expected
    assert rt.load().package.name == "other"


def test_nothing_to_open_says_how_to_get_a_package(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for args in (["generate", "Hi"], ["info"], ["verify"], ["bench"], ["chat"], ["pack"]):
        result = invoke(*args)
        assert_fails(result, "edgelm pull REPO")
        assert "edgelm install FILE_OR_URL" in result.output
    with pytest.raises(PackageError, match="no model package on this machine"):
        rt.load()


def test_a_prompt_that_names_a_package_is_refused(installed, tiny_package, model):
    for prompt in (str(tiny_package), installed):
        result = invoke("generate", prompt)
        assert_fails(result, "is a model package, not a prompt", code=2)
        assert f"edgelm generate -m {prompt}" in result.output
    # with -m given, any text is the prompt
    result = invoke("generate", "-m", tiny_package, installed, "--max-new-tokens", 3)
    assert result.exit_code == 0 and result.stdout == model.generate(installed, max_new_tokens=3).text + "\n"


def test_two_different_packages_are_refused(installed, tiny_package):
    assert_fails(invoke("info", tiny_package, "-m", installed), "name one, with -m", code=2)
    assert invoke("info", installed, "-m", installed).exit_code == 0  # the same one twice is fine


def test_an_installed_package_answers_to_its_store_name(installed, tmp_path, monkeypatch):
    from edgelm.runtime.server.app import model_names_for

    data = json.loads(invoke("info", "-m", installed, "--json").stdout)
    assert data["name"] == installed  # written into the manifest at install
    model = rt.load(installed)
    assert model.package.name == installed
    assert model_names_for(model, (), False).id == installed  # the id edgelm serve lists
    assert invoke("verify", installed).exit_code == 0  # every listed file is still as verified
    packed = invoke("pack", installed, "-o", tmp_path / "moved.zip")
    assert packed.exit_code == 0, packed.output
    with zipfile.ZipFile(tmp_path / "moved.zip") as archive:
        assert json.loads(archive.read(f"{installed}/manifest.json"))["name"] == installed
    monkeypatch.setenv("EDGELM_HOME", str(tmp_path / "elsewhere"))
    moved = invoke("install", tmp_path / "moved.zip")  # no --name: the name travels with the package
    assert moved.exit_code == 0 and "installed tiny " in moved.output, moved.output
