"""A forced tool call (tool_choice "required" or a named function) on a random-weight model over GPT-2's real
vocabulary: every reply parses into calls of the allowed functions, whose arguments validate against the
function's schema, unless the reply was cut by max_new_tokens; the same through the stream reader."""

import json

import jsonschema
import llguidance  # noqa: F401  (the test extra has it: without it these tests fail, never skip)
import pytest
from edgelm.runtime import load, tool_format
from weather_tools import WEATHER_CITY_6

CLOCK = {"type": "function", "function": {"name": "now"}}
TOOLS = [WEATHER_CITY_6, CLOCK]
ASK = [{"role": "user", "content": "Weather?"}]


@pytest.fixture(scope="module")
def model(gpt2_vocab_package):
    return load(gpt2_vocab_package)


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_forced_calls_parse_and_validate(model, choice):
    fmt = tool_format(model)
    kind, grammar = fmt.constraint(TOOLS, choice)
    schemas = {
        t["function"]["name"]: t["function"].get("parameters", {"type": "object", "maxProperties": 0}) for t in TOOLS
    }
    finished = 0
    for seed in range(12):
        reply = model.chat(
            ASK, tools=TOOLS, max_new_tokens=60, truncate=True, do_sample=True, seed=seed, **{kind: grammar}
        )
        content, calls = fmt.parse(reply.text)
        if reply.finish_reason == "length":
            continue
        finished += 1
        assert content is None and calls, reply.text
        for call in calls:
            assert choice == "required" or call.name == "get_weather"
            jsonschema.validate(json.loads(call.arguments_json), schemas[call.name])
        if finished == 1:  # the same reply streamed, read piece by piece
            reader = fmt.stream()
            options = dict(max_new_tokens=60, truncate=True, do_sample=True, seed=seed)
            for piece in model.chat_stream(ASK, tools=TOOLS, **options, **{kind: grammar}):
                reader.feed(piece)
            reader.finish()
            streamed_content, streamed = reader.result()
            assert streamed_content is None
            assert [(c.name, c.arguments_json) for c in streamed] == [(c.name, c.arguments_json) for c in calls]
    assert finished >= 6  # most random replies finish their call well within the budget


def test_chat_takes_tool_choice(model):
    fmt = tool_format(model)
    named = {"type": "function", "function": {"name": "now"}}
    reply = model.chat(ASK, tools=TOOLS, tool_choice=named, parallel_tool_calls=False, max_new_tokens=40, truncate=True)
    assert reply.finish_reason == "stop" and fmt.parse(reply.text)[0] is None
    assert [(c.name, c.arguments_json) for c in fmt.parse(reply.text)[1]] == [("now", "{}")]
    auto = model.chat(ASK, tools=TOOLS, tool_choice="auto", max_new_tokens=4, truncate=True)
    assert auto.text == model.chat(ASK, tools=TOOLS, max_new_tokens=4, truncate=True).text  # auto forces nothing
