"""Every generation default a package sets (generation_config.json, and task_specific_params for the pipeline) goes
through the typed check of run-time options: a value of any other form (a number as a string, a float such as
1e12, a bool, a list, an object) is refused at load in one line naming the file, never skipped, and so is one
that leaves no room for a prompt, whatever form or file it comes in."""

import json
from types import SimpleNamespace

import edgelm.runtime as rt
import pytest
from click.testing import CliRunner
from edgelm.runtime.cli.main import main
from edgelm.runtime.errors import EdgelmError, PackageError
from edgelm.runtime.generation_config import GenerationConfig
from edgelm.runtime.generation_defaults import generation_defaults, task_defaults
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from package_files import copy, rerecord

FUZZ = settings(
    max_examples=300, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck)
)
ARCH = SimpleNamespace(eos_token_id=0, pad_token_id=None, vocab_size=320, n_positions=64)  # the tiny package's


def _with(folder, name, change):
    path = folder / name
    path.write_text(json.dumps(change(json.loads(path.read_text()))))
    rerecord(folder, name)


@pytest.mark.parametrize(
    "setting",
    [
        {"max_length": 1e12},  # read as "no max_length" before, as were the next five
        {"max_length": 64.0},
        {"max_length": "1000000000000"},
        {"max_length": [64]},
        {"max_length": {"value": 10**12}},
        {"max_length": 20.5, "max_new_tokens": 8},  # max_new_tokens wins, but max_length is still checked
        {"max_length": True},
        {"max_new_tokens": "1000000000000"},
        {"max_new_tokens": 1e12},
        {"max_new_tokens": 10**12, "max_length": 20},
        {"max_new_tokens": None, "max_length": 10**12},
        {"min_new_tokens": 10**12},
        {"do_sample": "true"},
        {"temperature": "0.7"},
        {"top_k": 5.0},
        {"eos_token_id": ["0"]},
    ],
)
def test_a_generation_default_of_any_form_a_caller_could_not_give_is_refused_at_load(setting, tiny_package, tmp_path):
    folder = copy(tiny_package, tmp_path)
    _with(folder, "generation_config.json", lambda data: {**data, **setting})
    with pytest.raises(PackageError, match=r"generation_config\.json holds a setting edgelm cannot use"):
        rt.load(folder)
    result = CliRunner().invoke(main, ["generate", "-m", str(folder), "hi"])
    assert result.exit_code == 1 and result.output.count("\n") == 1 and "generation_config.json" in result.output


@pytest.mark.parametrize(
    "setting, fragment",
    [
        ({"max_new_tokens": 10**12}, "no room for a prompt"),
        ({"max_length": 10**12}, "over the model's 64-token context"),
        ({"max_length": "12"}, "max_length must be an integer"),
        ({"max_new_tokens": 1e12}, "max_new_tokens must be an integer"),
        ({"top_p": [0.5]}, "top_p"),
    ],
)
def test_the_pipelines_task_defaults_get_the_same_check(setting, fragment, tiny_package, tmp_path):
    folder = copy(tiny_package, tmp_path)
    if "config.json" not in json.loads((folder / "manifest.json").read_text())["files"]:
        pytest.fail("the tiny package lists its config.json")
    _with(folder, "config.json", lambda data: {**data, "task_specific_params": {"text-generation": setting}})
    with pytest.raises(PackageError, match=r"config\.json: task_specific_params\['text-generation'\] holds") as error:
        rt.pipeline("text-generation", model=rt.load(folder))
    assert fragment in str(error.value)


def test_defaults_that_fit_are_kept(tiny_package, tmp_path):
    folder = copy(tiny_package, tmp_path)
    _with(folder, "generation_config.json", lambda data: {**data, "max_length": 20, "max_new_tokens": 63})
    assert rt.load(folder).defaults.max_new_tokens == 63


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**13), 10**13) | st.floats(allow_nan=False) | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)
OPTIONS = ["max_new_tokens", "max_length", "min_new_tokens", "do_sample", "temperature", "top_k", "top_p", "stop"]
OPTIONS += ["repetition_penalty", "eos_token_id", "pad_token_id", "logit_bias", "seed", "ignore_eos", "logprobs"]


def _runtime_accepts(options: dict) -> bool:
    """Whether a caller could give these options at run time (each value as it is, max_length as the pipeline
    takes it), with room for a prompt."""
    try:
        base = GenerationConfig(eos_token_id=0, vocab_size=ARCH.vocab_size)
        config = base.with_options(**{k: v for k, v in options.items() if k != "max_length"})
        length = options.get("max_length")
        if length is not None and (not isinstance(length, int) or isinstance(length, bool) or length < 1):
            return False
        new = options.get("max_new_tokens")
        if new is None and length is not None:
            new = length
        return config.max_new_tokens >= 1 and (new is None or new < ARCH.n_positions)
    except EdgelmError:
        return False


@FUZZ
@given(data=st.dictionaries(st.sampled_from(OPTIONS), JSON, max_size=3))
def test_random_defaults_load_exactly_when_a_caller_could_give_them(data):
    """For any generation_config.json of these keys and any JSON values: it loads exactly when the same values
    pass the run-time check, and what loads is what the run-time check makes of them."""
    try:
        config = generation_defaults(data, ARCH, "generation_config.json")
    except PackageError:
        assert not _runtime_accepts(data), data
        return
    assert _runtime_accepts(data), data
    assert isinstance(config, GenerationConfig) and config.max_new_tokens < ARCH.n_positions


@FUZZ
@given(data=st.dictionaries(st.sampled_from(OPTIONS), JSON, max_size=3))
def test_random_task_defaults_are_refused_or_fit_the_context(data):
    base = GenerationConfig(eos_token_id=0, vocab_size=ARCH.vocab_size)
    try:
        kept = task_defaults(data, base, ARCH, "config.json")
    except PackageError:
        return
    settings_ = {k: v for k, v in data.items() if k != "max_length"}
    assert base.with_options(**settings_).max_new_tokens < ARCH.n_positions or "max_new_tokens" not in settings_
    assert kept == data and (data.get("max_length") is None or 1 <= data["max_length"] <= ARCH.n_positions)
