"""`edgelm export MODEL --random-weights`: a package of a published shape with random weights and GPT-2's
tokenizer, with no hub; one seed makes one package; what it cannot do is refused in one line."""

import hashlib
import json

import edgelm.runtime as rt
import pytest
from click.testing import CliRunner
from edgelm.export import random_weights
from edgelm.runtime.cli.main import main

SMALL = {"n_layer": 1, "n_embd": 32, "n_head": 2}  # a shape of its own, so the test exports in seconds


@pytest.fixture(autouse=True)
def small_shape(monkeypatch):
    monkeypatch.setitem(random_weights.SHAPES, "small", SMALL)


def export(folder, *options):
    return CliRunner().invoke(main, ["export", "small", "--random-weights", "--no-validate", "-o", str(folder), *options])


def weights_hash(folder):
    return hashlib.sha256((folder / "model.onnx.data").read_bytes()).hexdigest()


def test_a_random_package_has_the_shape_and_gpt2s_tokenizer_and_says_it_is_noise(tmp_path):
    result = export(tmp_path / "pkg")
    assert result.exit_code == 0, result.output
    assert "random weights (seed 0)" in result.stderr and "text is noise" in result.stderr
    model = rt.load(tmp_path / "pkg")
    assert (model.arch.n_layer, model.arch.n_embd, model.arch.vocab_size) == (1, 32, 50257)
    assert model.tokenizer.decode(model.encode("Hello, my name is")) == "Hello, my name is"
    assert len(model.encode(" the")) == 1  # GPT-2's merges, not bytes
    assert len(model.generate("Hello", max_new_tokens=4, do_sample=False).token_ids) == 4
    source = json.loads((tmp_path / "pkg" / "manifest.json").read_text())["source"]
    assert "small-random-weights-seed0" in json.dumps(source)


def test_one_seed_makes_one_package_and_another_seed_another(tmp_path):
    assert export(tmp_path / "a").exit_code == 0 and export(tmp_path / "b").exit_code == 0
    assert export(tmp_path / "c", "--seed", "7").exit_code == 0
    assert weights_hash(tmp_path / "a") == weights_hash(tmp_path / "b") != weights_hash(tmp_path / "c")


def test_the_default_folder_and_name_are_the_models(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["export", "small", "--random-weights", "--no-validate"])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "models" / "small" / "manifest.json").read_text())["name"] == "small"
    named = CliRunner().invoke(main, ["export", "small", "--random-weights", "--no-validate", "--name", "mine"])
    assert named.exit_code == 0 and (tmp_path / "models" / "mine" / "manifest.json").is_file()
    info = CliRunner().invoke(main, ["info", "-m", "mine"])  # a name under models/ is found by name
    assert info.exit_code == 0 and "models/mine" in info.output


@pytest.mark.parametrize(
    "options, message",
    [
        (["other", "--random-weights"], "--random-weights knows the shapes of"),
        (["small", "--seed", "3"], "--seed goes with --random-weights"),
        (["small", "--random-weights", "--revision", "v1"], "--random-weights downloads nothing"),
        (["small", "--random-weights", "--seed", "-1"], "--seed"),
    ],
)
def test_what_random_weights_cannot_do_is_refused_in_one_line(tmp_path, options, message):
    result = CliRunner().invoke(main, ["export", *options, "--no-validate", "-o", str(tmp_path / "out")])
    assert result.exit_code != 0 and message in result.output and "Traceback" not in result.output
    assert not (tmp_path / "out").exists()
