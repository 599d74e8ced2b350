"""Each input check written once (runtime/inputs.py, generation_config.logit_bias_ids) and the CLI's one mapping of
EdgelmError: what each caller shows a user for the same bad input."""

import pytest
from click.testing import CliRunner
from edgelm.runtime import EdgelmError, GenerationOptionError, PromptError
from edgelm.runtime.cli.main import main
from edgelm.runtime.generation_config import GenerationConfig, logit_bias_ids
from edgelm.runtime.inputs import check_text, check_token_ids, decode_utf8, is_token_id, text_problem


def test_a_token_id_is_an_integer_within_the_vocabulary():
    assert is_token_id(0, 320) and is_token_id(319, 320) and is_token_id(10**6)
    for value in (320, -1, True, 1.0, "5", None):
        assert not is_token_id(value, 320), value
    check_token_ids([0, 5, 319], 320)
    with pytest.raises(PromptError, match=r"^token id 320 is outside the vocabulary \(0\.\.319\)$"):
        check_token_ids([5, 320], 320)
    with pytest.raises(PromptError, match=r"^prompt\[1\]\[2\] is the token id True, outside the vocabulary"):
        check_token_ids([1, 2, True], 320, "prompt[1]")


def test_text_problem_names_the_place_of_a_lone_surrogate_in_nested_json():
    assert text_problem({"messages": [{"role": "user", "content": "fine"}]}, "body") is None
    problem = text_problem([{"role": "user", "content": "ok"}, {"content": "a\ud800"}], "messages")
    assert problem.startswith("messages[1].content is not Unicode text: it has a lone surrogate \\ud800 at character 1")
    assert "a field name in messages[0]" in text_problem([{"x\udcff": 1}], "messages")
    with pytest.raises(PromptError, match=r"the text is not Unicode text: .*\\udcff at character 0"):
        check_text("\udcff")


def test_text_nested_as_deep_as_json_allows_is_read_without_recursion():
    deep = "a\ud800"
    for _ in range(5000):  # far past Python's recursion limit; json.loads reads about 990 levels
        deep = [deep]
    assert text_problem(deep, "x").startswith("x" + "[0]" * 5000 + " is not Unicode text")
    assert text_problem({"a": [[[[["fine"]]]]], "b": [1, None, 2.5]}, "x") is None


def test_bytes_that_are_not_utf8_name_the_byte_and_its_offset():
    assert decode_utf8("café".encode(), "stdin") == "café"
    with pytest.raises(PromptError, match=r"^line 3 of stdin is not valid UTF-8 \(byte 0xe9 at offset 3\)"):
        decode_utf8(b"caf\xe9", "line 3 of stdin")


@pytest.mark.parametrize(
    "bias, words",
    [
        ({"x": 1}, "logit_bias keys must be token ids"),
        ({"9" * 5000: 1}, "logit_bias keys must be token ids"),  # int() of it would raise a bare ValueError
        ({5: float("nan")}, "finite numbers"),
        ({320: 1}, "logit_bias names token id(s) [320] outside this model's vocabulary (ids 0 to 319)"),
        ([5], "mapping of token id to bias"),
    ],
)
def test_logit_bias_is_read_one_way_for_the_api_and_the_server(bias, words):
    with pytest.raises(GenerationOptionError, match="logit_bias") as caught:
        logit_bias_ids(bias, 320)
    assert words in str(caught.value) and caught.value.param == "logit_bias"
    with pytest.raises(GenerationOptionError) as again:  # GenerationConfig gives the same line
        GenerationConfig(logit_bias=bias, vocab_size=320)
    assert str(again.value) == str(caught.value)
    assert logit_bias_ids({"5": 2, 7: -1.5}, 320) == {5: 2.0, 7: -1.5}


def test_every_command_turns_an_edgelm_error_into_one_line(tmp_path, monkeypatch):
    # the lazily imported store commands and the group's own commands alike: exit code 1, no traceback
    monkeypatch.setenv("EDGELM_HOME", str(tmp_path / "store"))
    runner = CliRunner()
    for args in (["rm", "no-such-package"], ["default", "no-such-package"], ["info", str(tmp_path / "absent")]):
        result = runner.invoke(main, args)
        assert result.exit_code == 1, (args, result.output)
        assert result.output.startswith("Error: ") and len(result.output.strip().splitlines()) == 1, result.output
        assert not isinstance(result.exception, EdgelmError) and "Traceback" not in result.output


@pytest.mark.parametrize("command", ["generate", "score", "bench", "chat", "serve"])
def test_threads_is_one_option_checked_as_load_checks_it(command):
    result = CliRunner().invoke(main, [command, "-m", "x", "--threads", "0"])
    assert result.exit_code == 2 and "--threads" in result.output
    assert "threads must be an integer from 1 to 1024" in result.output
