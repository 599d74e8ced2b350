"""Tools on POST /v1/chat/completions through the official openai client: the model's calls as message.tool_calls
with finish_reason "tool_calls", streamed delta.tool_calls the client reassembles, a tool round trip (assistant
tool_calls and tool results accepted), tool_choice none / auto / named / allowed_tools, parallel_tool_calls, and
each bad input a 400 naming its field on a server that keeps serving.

The tiny model's weights are random, so its engine answers a script (server_harness.ScriptedEngine): what is
tested is the server's reading of the answer, not the model's skill. The package has no chat template, so its
tool format is edgelm's default: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (docs/tools.md)."""

import json

import openai
import pytest
from server_harness import HTTP, openai_client
from weather_tools import WEATHER

TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
ASK = [{"role": "user", "content": "Weather in Paris?"}]
CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
TWO = CALL + '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>'


def client(server) -> openai.OpenAI:
    return openai_client(server)


def create(server, **options):
    options = {"model": "tiny", "messages": ASK, "temperature": 0, "max_tokens": 300, **options}
    return client(server).chat.completions.create(**options)


def test_a_call_is_message_tool_calls_with_finish_reason_tool_calls(server, model):
    model.script.say(CALL)
    answer = create(server, tools=[WEATHER])
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}


def test_streamed_calls_are_reassembled_by_the_client(server, model):
    model.script.say("Let me look. " + TWO)
    whole = create(server, tools=[WEATHER, TIME])
    chunks = list(create(server, tools=[WEATHER, TIME], stream=True))
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    calls = {}
    for c in chunks:
        for part in (c.choices[0].delta.tool_calls or []) if c.choices else []:
            entry = calls.setdefault(part.index, {"id": None, "name": "", "arguments": ""})
            entry["id"] = part.id or entry["id"]
            entry["name"] += (part.function.name or "") if part.function else ""
            entry["arguments"] += (part.function.arguments or "") if part.function else ""
    assert content == whole.choices[0].message.content == "Let me look."
    assert [(calls[i]["name"], json.loads(calls[i]["arguments"])) for i in sorted(calls)] == [
        ("get_weather", {"city": "Paris"}),
        ("get_time", {}),
    ]
    assert all(calls[i]["id"].startswith("call_") for i in calls)
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]
    # the openai client's own stream helper joins the deltas into whole calls
    with client(server).chat.completions.stream(
        model="tiny", messages=ASK, temperature=0, max_tokens=300, tools=[WEATHER, TIME]
    ) as stream:
        final = stream.get_final_completion()
    message = final.choices[0].message
    assert [c.function.name for c in message.tool_calls] == ["get_weather", "get_time"]
    assert json.loads(message.tool_calls[0].function.arguments) == {"city": "Paris"}


def test_parallel_tool_calls_false_keeps_the_first_call(server, model):
    model.script.say(TWO)
    calls = create(server, tools=[WEATHER, TIME], parallel_tool_calls=False).choices[0].message.tool_calls
    assert [c.function.name for c in calls] == ["get_weather"]
    chunks = list(create(server, tools=[WEATHER, TIME], parallel_tool_calls=False, stream=True))
    names = [p.function.name for c in chunks if c.choices for p in c.choices[0].delta.tool_calls or [] if p.id]
    assert names == ["get_weather"]


def test_tool_choice_none_renders_no_tools_and_reads_no_calls(server, model):
    model.script.say(CALL)
    choice = create(server, tools=[WEATHER], tool_choice="none").choices[0]
    assert choice.message.tool_calls is None and choice.message.content == CALL and choice.finish_reason == "stop"
    plain = create(server).choices[0]  # no tools: the same text is content
    assert plain.message.content == CALL and plain.message.tool_calls is None


def test_a_tool_round_trip(server, model):
    model.script.say(CALL)
    first = create(server, tools=[WEATHER]).choices[0].message
    history = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [c.model_dump() for c in first.tool_calls]},
        {"role": "tool", "tool_call_id": first.tool_calls[0].id, "content": '{"temperature": 21}'},
    ]
    model.script.say("It is 21 degrees in Paris.")
    answer = create(server, messages=history, tools=[WEATHER]).choices[0]
    assert answer.message.content == "It is 21 degrees in Paris." and answer.finish_reason == "stop"
    prompt = model.chat_template.render(history, tools=[WEATHER])
    assert "Tool: {\"temperature\": 21}" in prompt and '"city": "Paris"' in prompt


def test_allowed_tools_narrows_the_tools(server, model):
    model.script.say(CALL)
    choice = {"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": [{"type": "function", "function": {"name": "get_weather"}}]}}  # fmt: skip
    body = {"messages": ASK, "temperature": 0, "tools": [WEATHER, TIME], "tool_choice": choice}
    answer = HTTP.post(server.url + "/v1/chat/completions", json=body).json()
    assert answer["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "get_weather"


BAD = [
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice", "nope"),
    ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice", '"required"'),
    ({"tool_choice": "required"}, "tool_choice", "no tools"),
    ({"tools": {"a": 1}}, "tools", "must be a list"),
    ({"tools": [{"type": "custom", "custom": {"name": "x"}}]}, "tools[0].type", "functions only"),
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools[0].function.name", "letters"),
    (
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]},
        "tools[0].function.parameters",
        "object",
    ),
    (
        {
            "tools": [
                {
                    "type": "function",
                    "function": {
                        "name": "f",
                        "parameters": {"type": "object", "properties": {"x": {"type": "nonsense"}}},
                    },
                }
            ]
        },  # fmt: skip
        "tools[0].function.parameters",
        "the schema is invalid",
    ),
    ({"tools": [WEATHER], "parallel_tool_calls": "yes"}, "parallel_tool_calls", "true or false"),
    (
        {"messages": ASK + [{"role": "tool", "tool_call_id": "call_x", "content": "21"}]},
        "messages[1]",
        "tool result",
    ),
    (
        {
            "messages": ASK
            + [
                {
                    "role": "assistant",
                    "tool_calls": [
                        {"id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
                    ],
                },  # fmt: skip
                {"role": "tool", "tool_call_id": "call_b", "content": "21"},
            ]
        },
        "messages[2].tool_call_id",
        "answers no open call",
    ),
    (
        {
            "messages": ASK
            + [
                {
                    "role": "assistant",
                    "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{x"}}],
                }
            ]
        },  # fmt: skip
        "messages[1].tool_calls[0].function.arguments",
        "not JSON",
    ),
]


@pytest.mark.parametrize("extra, param, words", BAD)
def test_bad_tool_input_is_a_400_naming_the_field(server, extra, param, words):
    body = {"messages": ASK, "max_tokens": 4, **extra}
    response = HTTP.post(server.url + "/v1/chat/completions", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and words in error["message"] and "\n" not in error["message"], error
    assert HTTP.post(server.url + "/v1/chat/completions", json={"messages": ASK, "max_tokens": 2}).status_code == 200


def test_log_probs_of_a_streamed_answer_with_calls_all_arrive(server, model):
    """Tokens held back while a call is being read ride on a later chunk; none are lost or sent twice."""
    model.script.say("Let me look. " + CALL)
    whole = create(server, tools=[WEATHER], logprobs=True).choices[0]
    chunks = list(create(server, tools=[WEATHER], logprobs=True, stream=True))
    streamed = [e.token for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert streamed == [e.token for e in whole.logprobs.content]
    assert "".join(streamed) == "Let me look. " + CALL


def test_each_of_n_choices_streams_its_own_calls(server, model):
    model.script.say("Sure. " + CALL)
    chunks = list(create(server, tools=[WEATHER], n=2, stream=True))
    for index in (0, 1):
        parts = [c.choices[0] for c in chunks if c.choices and c.choices[0].index == index]
        calls = [p for part in parts for p in part.delta.tool_calls or []]
        assert [p.function.name for p in calls if p.id] == ["get_weather"]
        assert json.loads("".join(p.function.arguments or "" for p in calls)) == {"city": "Paris"}
        assert "".join(part.delta.content or "" for part in parts) == "Sure."
        assert parts[-1].finish_reason == "tool_calls"


@pytest.mark.parametrize("choice", ["auto", "required"])
def test_a_call_cut_by_max_tokens_is_reported_as_cut_and_never_content(server, model, choice):
    """finish_reason "length", the calls completed before the cut in tool_calls, the cut one nowhere: no raw
    `<tool_call>` markup in content, whole or streamed."""
    first = len(model.script.tokenizer.encode(CALL).ids)
    model.script.say(TWO)
    for limit, names in ((first + 6, ["get_weather"]), (first - 4, [])):
        options = dict(tools=[WEATHER, TIME], tool_choice=choice, max_tokens=limit)
        answer = create(server, **options).choices[0]
        assert answer.finish_reason == "length"
        assert [c.function.name for c in answer.message.tool_calls or []] == names
        assert not answer.message.content, answer.message.content
        chunks = list(create(server, **options, stream=True))
        content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        streamed = [p.function.name for c in chunks if c.choices for p in c.choices[0].delta.tool_calls or [] if p.id]
        assert not content and streamed == names
        assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]


def _tool(i: int) -> dict:
    properties = {f"field_{k}": {"type": "string", "description": "a value " * 8} for k in range(6)}
    return {"type": "function", "function": {"name": f"tool_{i}", "parameters": {"type": "object", "properties": properties}}}  # fmt: skip


@pytest.mark.parametrize(
    "extra, param, words",
    [
        ({"tools": [_tool(i) for i in range(120)], "max_tokens": 4}, "tools", "fewer tools"),
        ({"tools": [WEATHER], "max_tokens": 2}, "max_tokens", "a forced call of these tools needs at least"),
        ({"tools": [WEATHER], "max_completion_tokens": 2}, "max_completion_tokens", "max_completion_tokens=2"),
    ],
)
def test_errors_of_a_forced_call_name_what_the_client_sent(server, extra, param, words):
    """The grammar forcing a call is edgelm's, never the client's: its errors name tools, or the client's field."""
    body = {"messages": ASK, "tool_choice": "required", **extra}
    response = HTTP.post(server.url + "/v1/chat/completions", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and words in error["message"], error
    assert "grammar must" not in error["message"] and "max_new_tokens" not in error["message"]
