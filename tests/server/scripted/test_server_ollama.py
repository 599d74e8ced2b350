"""Ollama's API through the official `ollama` Python client: tags, show, ps, version, chat and generate (streamed
and not), `format` as "json" and as a schema, `options` under Ollama's names, tools and a tool round trip, and
bad input refused in Ollama's error shape ({"error"}) on a server that keeps serving.

The engine answers a script (server_harness.ScriptedEngine): what is tested is the translation, not the model."""

import json

import pytest
from server_harness import HTTP
from weather_tools import WEATHER

ollama = pytest.importorskip("ollama", reason="the official ollama client (the test extra)")

ASK = [{"role": "user", "content": "Weather in Paris?"}]
CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'


@pytest.fixture
def client(server):
    return ollama.Client(host=server.url)


def test_version_tags_ps_and_show_describe_the_one_model(client, model):
    assert client._client.get("/api/version").json()["version"]
    listed = client.list().models
    assert [m.model for m in listed] == ["tiny"]
    assert listed[0].details.family == "gpt2" and listed[0].details.format == "onnx" and listed[0].size > 0
    assert len(listed[0].digest) == 64
    assert [m.model for m in client.ps().models] == ["tiny"]
    shown = client.show("tiny")
    assert "tools" in shown.capabilities and shown.details.family == "gpt2"
    assert shown.modelinfo["gpt2.context_length"] == model.arch.n_positions


def test_chat_answers_the_message_with_counts(client, model):
    model.script.say("Sunny and warm.")
    reply = client.chat("tiny", messages=ASK, options={"temperature": 0, "num_predict": 40})
    assert reply.message.role == "assistant" and reply.message.content == "Sunny and warm."
    assert reply.done and reply.done_reason == "stop" and reply.eval_count > 0 and reply.prompt_eval_count > 0
    assert reply.total_duration > 0


def test_a_streamed_chat_is_json_lines_ending_in_done(client, model):
    model.script.say("Sunny and warm.")
    parts = list(client.chat("tiny", messages=ASK, stream=True, options={"temperature": 0, "num_predict": 40}))
    assert "".join(p.message.content for p in parts) == "Sunny and warm."
    assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True] and parts[-1].eval_count > 0


def test_num_predict_cuts_the_answer_and_says_length(client, model):
    model.script.say("one two three four five six seven eight")
    reply = client.chat("tiny", messages=ASK, options={"temperature": 0, "num_predict": 3})
    assert reply.done_reason == "length" and reply.eval_count == 3


def test_generate_renders_the_template_or_sends_the_raw_prompt(client, model):
    model.script.say("Paris.")
    assert client.generate("tiny", "Capital of France?", options={"temperature": 0}).response == "Paris."
    raw = client.generate("tiny", "The capital of France is", raw=True, stream=True, options={"temperature": 0})
    assert "".join(p.response for p in raw).strip() == "Paris."


def test_format_json_and_a_schema_constrain_the_answer(client, model):
    model.script.say('{"city":"Paris"}')  # compact, as structured output writes JSON
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    reply = client.chat("tiny", messages=ASK, format=schema, options={"temperature": 0, "num_predict": 60})
    assert json.loads(reply.message.content) == {"city": "Paris"}
    reply = client.generate("tiny", "A city as JSON:", format="json", options={"temperature": 0, "num_predict": 60})
    assert isinstance(json.loads(reply.response), dict)


def test_tools_come_back_as_calls_and_a_round_trip_is_accepted(client, model):
    model.script.say(CALL, "It is sunny in Paris.")
    reply = client.chat("tiny", messages=ASK, tools=[WEATHER], options={"temperature": 0, "num_predict": 100})
    (call,) = reply.message.tool_calls
    assert call.function.name == "get_weather" and call.function.arguments == {"city": "Paris"}
    assert not reply.message.content
    history = [*ASK, reply.message, {"role": "tool", "content": '{"celsius": 21}', "tool_name": "get_weather"}]
    answer = client.chat("tiny", messages=history, tools=[WEATHER], options={"temperature": 0, "num_predict": 40})
    assert answer.message.content == "It is sunny in Paris." and not answer.message.tool_calls


def test_a_streamed_tool_call_arrives_whole(client, model):
    model.script.say(CALL)
    parts = list(client.chat("tiny", messages=ASK, tools=[WEATHER], stream=True, options={"temperature": 0}))
    calls = [c for p in parts for c in (p.message.tool_calls or [])]
    assert [(c.function.name, c.function.arguments) for c in calls] == [("get_weather", {"city": "Paris"})]
    assert parts[-1].done


@pytest.mark.parametrize(
    "body, field",
    [
        ({"model": "tiny", "messages": ASK, "options": {"mirostat": 2}}, "mirostat"),
        ({"model": "tiny", "messages": ASK, "options": {"temprature": 0.5}}, "temprature"),
        ({"model": "tiny", "messages": ASK, "options": {"temperature": -1}}, "temperature"),
        ({"model": "tiny", "messages": ASK, "format": "yaml"}, "format"),
        ({"model": "tiny", "messages": [{"role": "user", "content": "x", "images": ["aGk="]}]}, "images"),
        ({"model": "tiny", "messages": "hi"}, "messages"),
        ({"model": "tiny", "messages": ASK, "think": True}, "think"),
        ({"model": "tiny", "messages": ASK, "suffix": "x"}, "suffix"),
    ],
)
def test_bad_input_is_refused_in_ollamas_shape(server, body, field):
    answer = HTTP.post(server.url + "/api/chat", json=body | {"stream": False})
    assert answer.status_code == 400, answer.text
    assert set(answer.json()) == {"error"} and field in answer.json()["error"]
    assert HTTP.get(server.url + "/health").status_code == 200


def test_an_unknown_model_is_a_404_the_client_raises(client):
    with pytest.raises(ollama.ResponseError) as caught:
        client.chat("other", messages=ASK)
    assert caught.value.status_code == 404 and "does not exist" in caught.value.error


def test_options_that_place_the_model_are_accepted_and_change_nothing(client, model):
    model.script.say("Sunny.")
    placed = {"temperature": 0, "num_ctx": 4096, "num_thread": 2, "num_gpu": 0, "repeat_last_n": 64}
    assert client.chat("tiny", messages=ASK, options=placed).message.content == "Sunny."
