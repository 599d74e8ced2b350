"""Every generation option is declared once (runtime/generation_options.py): the command line's flags and the
request body's fields are built from that table, so an option added there is offered by both. And `ban`, the
words never to generate, is the library's, offered alike to the API, the command line, prompt files and the server."""

import dataclasses
import json

import click
import pytest
from click.testing import CliRunner
from edgelm.runtime import GenerationOptionError
from edgelm.runtime.cli.main import main
from edgelm.runtime.cli.options import generation_options
from edgelm.runtime.generation_config import GenerationConfig
from edgelm.runtime.generation_options import EXTRA, NOT_OFFERED, OPTIONS, Option
from edgelm.runtime.server.api.requests import Limits, sampling_body, sampling_request
from edgelm.runtime.server.api.schema import validate
from server_harness import HTTP, InProcessServer, complete
from weather_tools import WEATHER_UNREQUIRED

PROMPT = "Once upon a time, in a land"
NEW = Option("draft_tokens", "Tokens a draft model proposes per step.", value_type=int, chat=True, http=EXTRA)


def test_every_config_field_is_declared_as_an_option_or_as_not_offered():
    declared = [option.name for option in OPTIONS]
    assert len(declared) == len(set(declared))
    fields = {f.name for f in dataclasses.fields(GenerationConfig)}
    assert fields == (set(declared) - {"ban"}) | set(NOT_OFFERED)


def test_an_option_added_to_the_declaration_is_a_flag_of_the_command_line():
    @click.command()
    @generation_options(OPTIONS + (NEW,))
    def command(**options):
        click.echo(json.dumps({k: v for k, v in options.items() if v is not None and v != ()}))

    help_text = CliRunner().invoke(command, ["--help"]).output
    assert "--draft-tokens INTEGER" in help_text and "Tokens a draft model proposes per step." in help_text
    result = CliRunner().invoke(command, ["--draft-tokens", "4", "--top-k", "3", "--stop", "a", "--stop", "b"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == {"draft_tokens": 4, "top_k": 3, "stop": ["a", "b"]}
    refused = CliRunner().invoke(command, ["--draft-tokens", "four"])
    assert refused.exit_code == 2 and "--draft-tokens" in refused.output


def test_an_option_added_to_the_declaration_is_a_field_of_the_request_body():
    declared = OPTIONS + (NEW,)
    body = sampling_body(declared)
    assert "draft_tokens" in body.model_fields and "draft_tokens" not in sampling_body().model_fields
    parsed = validate(body, {"draft_tokens": 4, "top_k": 2})
    given = {name for name in parsed.model_fields_set}
    options = sampling_request(parsed, given, 100, Limits(), declared=declared)["options"]
    assert options["draft_tokens"] == 4 and options["top_k"] == 2
    with pytest.raises(Exception, match="draft_tokens"):
        validate(body, {"draft_tokens": "four"})


def test_a_number_options_interval_is_what_the_check_and_the_help_say():
    import re

    from edgelm.runtime.generation_config import RANGES, Interval

    helps = {o.name: o.help for o in OPTIONS}
    for name, interval in RANGES.items():
        assert interval.high in interval and (interval.low + interval.high) / 2 in interval
        assert (interval.low in interval) != interval.low_open
        with pytest.raises(GenerationOptionError, match=re.escape(str(interval))):
            GenerationConfig(**{name: interval.high + 1})
        assert name == "min_p" or str(interval) in helps[name]
    assert str(Interval(0, 1, low_open=True)) == "(0, 1]" and 0 not in Interval(0, 1, low_open=True)
    assert float("nan") not in Interval(-2, 2) and True not in Interval(0, 1)


def test_the_real_commands_and_body_are_built_from_the_declaration():
    generate, chat = main.get_command(None, "generate"), main.get_command(None, "chat")
    for option in OPTIONS:
        if option.help is not None:
            assert option.name in {p.name for p in generate.params}
            assert (option.name in {p.name for p in chat.params}) == option.chat
    fields = sampling_body().model_fields
    assert {o.name for o in OPTIONS if o.http} <= set(fields) and "min_tokens" in fields


# --- ban: words never to generate ------------------------------------------------------------------------


def a_generated_word(model) -> str:
    before = model.generate(PROMPT, max_new_tokens=20)
    return next(w for w in (model.tokenizer.decode([t]) for t in before.token_ids) if w.isalpha() and len(w) >= 2)


def written(ids: list, word_ids: list) -> bool:
    return any(ids[i : i + len(word_ids)] == word_ids for i in range(len(ids)))


def test_ban_turns_words_into_the_token_sequences_that_write_them(model):
    word = a_generated_word(model)
    settings = model.settings(ban=[word])
    assert settings.bad_words_ids == (tuple(model.encode(word)), tuple(model.encode(" " + word)))
    both = model.settings(ban=word, bad_words_ids=[[5]])
    assert both.bad_words_ids == ((5,), *settings.bad_words_ids)
    completion = model.generate(PROMPT, max_new_tokens=20, ban=[word])
    assert not written(completion.token_ids, model.encode(word)) and word not in completion.text


@pytest.mark.parametrize(
    "ban, fragment",
    [([""], "non-empty strings"), ([3], "non-empty strings"), (["w"] * 65, "at most 64 words"), (["\ud800"], "ban")],
)
def test_a_bad_ban_names_the_option(model, ban, fragment):
    with pytest.raises(GenerationOptionError, match=fragment) as caught:
        model.settings(ban=ban)
    assert caught.value.param == "ban"


def test_a_prompt_file_line_can_ban_words(model):
    from edgelm.runtime.apps.prompt_records import generate_records

    word = a_generated_word(model)
    records = [{"prompt": PROMPT, "ban": [word], "max_new_tokens": 20}, {"prompt": PROMPT, "max_new_tokens": 20}]
    banned, free = generate_records(model, model.settings(), records)
    assert written(free["token_ids"], model.encode(word)) and not written(banned["token_ids"], model.encode(word))


@pytest.fixture(scope="module")
def server(model):
    s = InProcessServer(model)
    yield s
    s.stop()


def test_the_server_takes_ban_as_an_extension_field(server, model):
    word = a_generated_word(model)
    expected = model.generate(PROMPT, max_new_tokens=20, ban=[word], top_k=0)
    body = {"prompt": PROMPT, "max_tokens": 20, "temperature": 0, "ban": [word]}
    answer = complete(server, body).json()
    assert answer["choices"][0]["text"] == expected.text and word not in expected.text
    chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5, "temperature": 0, "ban": word}
    assert HTTP.post(server.url + "/v1/chat/completions", json=chat).status_code == 200
    refused = complete(server, {"prompt": PROMPT, "ban": [""]})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "ban"


# --- a chat request's settings are built once ------------------------------------------------------------


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"max_tokens": 4, "stop": "x"},
        {"tools": [WEATHER_UNREQUIRED], "tool_choice": "required", "truncate": True, "max_tokens": 50},
    ],
    ids=["no-max-tokens", "max-tokens-and-stop", "forced-tool-call"],
)
def test_a_chat_request_builds_its_settings_once(server, model, monkeypatch, extra):
    """The options, the tools' constraint, the template's stop strings and the reply's length: one with_options
    (a tool's schema is checked on its own, by tool_calls.check_schemas)."""
    built = []
    with_options = GenerationConfig.with_options
    monkeypatch.setattr(GenerationConfig, "with_options", lambda self, **o: built.append(o) or with_options(self, **o))
    body = {"messages": [{"role": "user", "content": "Hi"}], "temperature": 0, **extra}
    answer = HTTP.post(server.url + "/v1/chat/completions", json=body)
    assert answer.status_code == 200, answer.text
    assert len(built) == 1
    assert set(model.chat_template.stop) <= set(built[0]["stop"]) and built[0]["max_new_tokens"] >= 1


def test_the_chat_command_builds_its_settings_once_for_every_turn(tiny_package, monkeypatch):
    from edgelm.runtime.cli.main import main

    built = []
    with_options = GenerationConfig.with_options
    monkeypatch.setattr(GenerationConfig, "with_options", lambda self, **o: built.append(o) or with_options(self, **o))
    result = CliRunner().invoke(
        main, ["chat", "-m", str(tiny_package), "--max-new-tokens", "3", "--stop", "x"], input="The fox\nTime\nA\n"
    )
    assert result.exit_code == 0, result.output
    assert len(built) == 1 and built[0]["stop"][0] == "x"
