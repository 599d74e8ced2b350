"""Helpers shared by the store tests: a store in tmp_path, a listing to prove a failure left it as it was, and the
CLI through click's CliRunner."""

import json
from pathlib import Path

from click.testing import CliRunner
from edgelm.runtime.cli.main import main


def make_store(tmp_path, monkeypatch) -> Path:
    """An empty store ($EDGELM_HOME), with huggingface_hub's cache moved into tmp_path too."""
    import huggingface_hub.constants

    root = tmp_path / "store"
    root.mkdir()
    monkeypatch.setenv("EDGELM_HOME", str(root))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    return root


def listing(root: Path, hidden: bool = True) -> list:
    """Every path under root with its size: equal before and after means the store was left as it was."""
    return sorted(
        (str(p.relative_to(root)), p.stat().st_size if p.is_file() else None)
        for p in root.rglob("*")
        if hidden or not p.relative_to(root).parts[0].startswith(".")
    )


def invoke(*args, input=None):
    return CliRunner().invoke(main, [str(a) for a in args], input=input)


def assert_clean_failure(result, fragment: str):
    """A non-zero exit with one readable line, never a Python traceback."""
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, result.output
    assert fragment in errors[0], result.output


def name_of(package) -> str:
    """The name a package installs under: its manifest's."""
    return json.loads((package / "manifest.json").read_text())["name"]
