"""Forced tool calls on packages whose tokenizer and chat template are laid out as real families publish theirs
(tests/support/tokenizer_layouts.py): Qwen2.5-Instruct's (a Qwen2 model; `<tool_call>` and `</tool_call>` are added tokens
that are text, and a call is written with them), Llama 3.2-Instruct's (256 special tokens, `<|python_tag|>` among
them) and SmolLM2-Instruct's (specials inside the vocabulary), through the Python API and the server (chat,
streamed, and the Responses API) with the openai client. The weights are random: the model either samples (every
finished reply parses and validates) or answers a script (server_harness.scripted), the call written in its
family's format."""

import json

import jsonschema
import llguidance  # noqa: F401  (the test extra has it: without it these tests fail, never skip)
import pytest
from edgelm.runtime import load, tool_format
from server_harness import openai_client, scripted_model, serve_alone
from weather_tools import WEATHER_CITY_8

CLOCK = {"type": "function", "function": {"name": "now"}}
ASK = [{"role": "user", "content": "Weather?"}]
FAMILIES = {"qwen2.5": "hermes", "llama3.2": "llama3", "smollm2": "smollm2"}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request, layout_package):
    return request.param, layout_package(request.param)


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_sampled_forced_calls_parse_and_validate(family, choice):
    name, package = family
    model = load(package)
    fmt = tool_format(model)
    assert fmt.name == FAMILIES[name]
    finished = 0
    for seed in range(6):
        options = dict(tools=[WEATHER_CITY_8, CLOCK], tool_choice=choice, max_new_tokens=150, seed=seed)
        reply = model.chat(ASK, do_sample=True, **options)
        if name == "qwen2.5":  # the call's forced start is the one token Qwen2.5 writes it with
            assert reply.token_ids[0] == model.tokenizer.token_to_id("<tool_call>")
        content, calls = fmt.parse(reply.text, cut=reply.finish_reason == "length")
        assert not content, reply.text
        if reply.finish_reason == "length":
            continue
        finished += 1
        assert calls, reply.text
        for call in calls:
            schema = WEATHER_CITY_8["function"]["parameters"] if call.name == "get_weather" else {"maxProperties": 0}
            jsonschema.validate(json.loads(call.arguments_json), schema)
    assert finished >= 1


@pytest.fixture(scope="module")
def server(family):
    name, package = family
    model = scripted_model(package)
    model.script.say(tool_format(model).call_text([("get_weather", {"city": "Paris"})]))
    s = serve_alone(model, max_tokens=200)
    yield s
    s.stop()


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_forced_calls_through_the_openai_client(server, choice):
    client = openai_client(server)
    options = dict(model="tiny", messages=ASK, tools=[WEATHER_CITY_8, CLOCK], tool_choice=choice, temperature=0)
    answer = client.chat.completions.create(**options, max_tokens=100).choices[0]
    assert answer.finish_reason == "tool_calls" and answer.message.content is None
    (call,) = answer.message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    chunks = list(client.chat.completions.create(**options, max_tokens=100, stream=True))
    parts = [p for c in chunks if c.choices for p in c.choices[0].delta.tool_calls or []]
    assert "".join(p.function.arguments or "" for p in parts) == call.function.arguments
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]
    response = client.responses.create(
        model="tiny",
        input="Weather?",
        tools=[{"type": "function", **WEATHER_CITY_8["function"]}],
        tool_choice="required",
    )
    (item,) = [i for i in response.output if i.type == "function_call"]
    assert item.name == "get_weather" and json.loads(item.arguments) == {"city": "Paris"}
