"""Structured output and forced tool calls through the official openai client, on a tiny model with random
weights (the worst case: nothing but the constraint makes its answers parse): response_format json_schema and
json_object on chat and completions, `chat.completions.parse(response_format=PydanticModel)`, the Responses
API's text.format and `responses.parse`, tool_choice "required" and a named function, streamed or not; a bad
schema is a 400 naming response_format on a server that keeps serving."""

import json
from typing import Literal

import jsonschema
import openai
import pytest
from edgelm.runtime import load
from edgelm.runtime.server.api.requests import Limits
from pydantic import BaseModel, Field
from server_harness import HTTP, InProcessServer
from weather_tools import WEATHER_PARIS_ROME_HOURS

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 9},
        "sunny": {"type": "boolean"},
    },
    "required": ["city", "days", "sunny"],
    "additionalProperties": False,
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}, "additionalProperties": False}}}  # fmt: skip
ASK = [{"role": "user", "content": "Plan a trip"}]
FORMAT = {"type": "json_schema", "json_schema": {"name": "trip", "schema": SCHEMA, "strict": True}}


class Trip(BaseModel):
    city: Literal["Paris", "Rome", "Oslo"]
    days: int = Field(ge=1, le=9)
    sunny: bool


@pytest.fixture(scope="module")
def model(tiny_package_long):
    return load(tiny_package_long)


@pytest.fixture(scope="module")
def server(model):
    s = InProcessServer(model, Limits(max_tokens=200), model_names=("tiny",))
    yield s
    s.stop()


def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def chat(server, **options):
    return client(server).chat.completions.create(**{"model": "tiny", "messages": ASK, "max_tokens": 120, **options})


@pytest.mark.parametrize("seed", range(6))
def test_json_schema_answers_validate_at_temperature_1(server, seed):
    choice = chat(server, response_format=FORMAT, seed=seed, temperature=1.0).choices[0]
    assert choice.finish_reason == "stop", choice
    jsonschema.validate(json.loads(choice.message.content), SCHEMA)


def test_json_schema_streamed_and_n(server):
    chunks = list(chat(server, response_format=FORMAT, seed=3, n=2, stream=True))
    texts = ["", ""]
    for c in chunks:
        for part in c.choices:
            texts[part.index] += part.delta.content or ""
    for text in texts:
        jsonschema.validate(json.loads(text), SCHEMA)
    whole = chat(server, response_format=FORMAT, seed=3, n=2)
    assert [c.message.content for c in whole.choices] == texts


def test_json_object_on_chat_and_completions(server):
    """Any JSON object: random weights may write a long one, cut by max_tokens ("length"); a finished one parses."""
    choice = chat(server, response_format={"type": "json_object"}, seed=1).choices[0]
    body = {"prompt": "JSON:", "max_tokens": 120, "seed": 2, "response_format": {"type": "json_object"}}
    other = HTTP.post(server.url + "/v1/completions", json=body).json()["choices"][0]
    for text, reason in ((choice.message.content, choice.finish_reason), (other["text"], other["finish_reason"])):
        assert text.startswith("{") and reason in ("stop", "length")
        if reason == "stop":
            assert isinstance(json.loads(text), dict)


def test_the_openai_clients_parse_fills_a_pydantic_model(server):
    answer = client(server).chat.completions.parse(
        model="tiny", messages=ASK, response_format=Trip, max_tokens=120, seed=5
    )
    assert isinstance(answer.choices[0].message.parsed, Trip)


def test_responses_text_format_and_parse(server):
    text = {"format": {"type": "json_schema", "name": "trip", "schema": SCHEMA, "strict": True}}
    answer = client(server).responses.create(model="tiny", input="Plan a trip", text=text, max_output_tokens=120)
    jsonschema.validate(json.loads(answer.output_text), SCHEMA)
    parsed = client(server).responses.parse(model="tiny", input="Plan a trip", text_format=Trip, max_output_tokens=120)
    assert isinstance(parsed.output_parsed, Trip)


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_a_forced_call_is_a_valid_call(server, choice):
    for seed in range(3):
        answer = chat(
            server, tools=[WEATHER_PARIS_ROME_HOURS, TIME], tool_choice=choice, seed=seed, max_tokens=150
        ).choices[0]
        # "length": parallel calls ran to max_tokens; the ones completed are there, the cut one is not
        assert answer.finish_reason in ("tool_calls", "length") and answer.message.tool_calls, answer
        assert answer.message.content is None
        for call in answer.message.tool_calls:
            tool = {"get_weather": WEATHER_PARIS_ROME_HOURS, "get_time": TIME}[call.function.name]
            jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])
        if choice != "required":
            assert {c.function.name for c in answer.message.tool_calls} == {"get_weather"}


def test_a_forced_call_streamed(server):
    chunks = list(
        chat(server, tools=[WEATHER_PARIS_ROME_HOURS], tool_choice="required", seed=4, max_tokens=150, stream=True)
    )
    arguments = "".join(
        p.function.arguments or "" for c in chunks if c.choices for p in c.choices[0].delta.tool_calls or []
    )
    jsonschema.validate(json.loads(arguments), WEATHER_PARIS_ROME_HOURS["function"]["parameters"])
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


@pytest.mark.parametrize(
    "response_format, param, words",
    [
        (
            {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}},
            "response_format",
            "json_schema",
        ),  # fmt: skip
        (
            {"type": "json_schema", "json_schema": {"name": "x", "schema": []}},
            "response_format.json_schema.schema",
            "an object",
        ),  # fmt: skip
        (
            {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA, "extra": 1}},
            "response_format.json_schema.extra",
            "unknown field",
        ),  # fmt: skip
        (
            {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "if": {}, "then": {}}}},
            "response_format",
            "if, then",
        ),  # fmt: skip
        ({"type": "yaml"}, "response_format.type", "json_schema"),
        ("json", "response_format", "must be an object"),
    ],
)
def test_bad_response_formats_are_400s(server, response_format, param, words):
    body = {"messages": ASK, "max_tokens": 4, "response_format": response_format}
    response = HTTP.post(server.url + "/v1/chat/completions", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and words in error["message"] and "\n" not in error["message"], error
    assert HTTP.post(server.url + "/v1/chat/completions", json={"messages": ASK, "max_tokens": 2}).status_code == 200


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_a_forced_call_with_a_format_is_the_call(server, choice):
    """The Agents SDK's output_type with tool_choice "required", as OpenAI takes it: the call is forced, and the
    format holds the later answer that is no call; a bad format is still a 400 naming response_format."""
    finished = 0
    for seed in range(3):
        answer = chat(
            server,
            tools=[WEATHER_PARIS_ROME_HOURS, TIME],
            tool_choice=choice,
            response_format=FORMAT,
            seed=seed,
            max_tokens=150,
        ).choices[0]
        if not answer.message.tool_calls:  # cut inside its first call
            continue
        finished += 1
        assert answer.finish_reason in ("tool_calls", "length") and answer.message.content is None
        for call in answer.message.tool_calls:
            assert choice == "required" or call.function.name == "get_weather"
            if call.function.name == "get_weather":
                jsonschema.validate(
                    json.loads(call.function.arguments), WEATHER_PARIS_ROME_HOURS["function"]["parameters"]
                )
    assert finished
    bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}
    body = {
        "messages": ASK,
        "response_format": bad,
        "tools": [WEATHER_PARIS_ROME_HOURS],
        "tool_choice": choice,
        "max_tokens": 4,
    }
    error = HTTP.post(server.url + "/v1/chat/completions", json=body).json()["error"]
    assert error["param"] == "response_format"
    final = chat(
        server, tools=[WEATHER_PARIS_ROME_HOURS], tool_choice="none", response_format=FORMAT, max_tokens=150
    ).choices[0]
    assert final.finish_reason == "length" or jsonschema.validate(json.loads(final.message.content), SCHEMA) is None


def test_auto_tools_with_a_format_answer_a_call_or_the_json(server):
    """An agent's usual request: tools it may call, and a schema for its final answer. Each answer is one of them."""
    for seed in range(6):
        choice = chat(
            server, tools=[WEATHER_PARIS_ROME_HOURS], response_format=FORMAT, seed=seed, max_tokens=150
        ).choices[0]
        if choice.message.tool_calls:
            assert choice.finish_reason in ("tool_calls", "length") and not choice.message.content
            assert choice.message.tool_calls[0].function.name == "get_weather"
            jsonschema.validate(json.loads(choice.message.tool_calls[0].function.arguments), WEATHER_PARIS_ROME_HOURS["function"]["parameters"])  # fmt: skip
        else:
            assert choice.finish_reason == "stop", choice
            jsonschema.validate(json.loads(choice.message.content), SCHEMA)


@pytest.mark.parametrize(
    "path, extra, words",
    [
        ("/v1/chat/completions", {"response_format": FORMAT}, "stop cannot be given with response_format"),
        ("/v1/completions", {"response_format": {"type": "json_object"}}, "stop cannot be given with response_format"),
        ("/v1/chat/completions", {"tools": [WEATHER_PARIS_ROME_HOURS], "tool_choice": "required"}, "forces a call"),
    ],
)
def test_stop_with_a_constrained_answer_is_refused(server, path, extra, words):
    """A stop string the answer holds would cut it into text the schema does not allow under finish_reason "stop"
    ({"const": "STOPWORD"} with stop ["STOP"] gave `"`): the conflict is refused before generation."""
    body = {"max_tokens": 150, "stop": ["STOP"], **extra}
    body.update({"messages": ASK} if "chat" in path else {"prompt": "Hi"})
    response = HTTP.post(server.url + path, json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "stop" and words in error["message"] and "\n" not in error["message"], error
    del body["stop"]
    assert HTTP.post(server.url + path, json=body).status_code == 200
    with_tools_auto = {
        "messages": ASK,
        "max_tokens": 4,
        "stop": ["STOP"],
        "tools": [WEATHER_PARIS_ROME_HOURS],
    }  # nothing forced
    assert HTTP.post(server.url + "/v1/chat/completions", json=with_tools_auto).status_code == 200


def test_a_schema_whose_answer_is_a_special_tokens_text_is_refused_before_generation(server):
    """{"const": "<|endoftext|>"} passed the checks, then failed after the first token inside llguidance."""
    special = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"const": "<|endoftext|>"}}}
    response = HTTP.post(server.url + "/v1/chat/completions", json={"messages": ASK, "response_format": special})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "response_format" and "special token" in error["message"], error
    assert "\n" not in error["message"] and "ÿ" not in error["message"]
    text = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"const": "<|endoftext"}}}  # not special
    answer = chat(server, response_format=text, max_tokens=40).choices[0]
    assert answer.finish_reason == "stop" and json.loads(answer.message.content) == "<|endoftext"
