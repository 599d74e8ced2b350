"""POST /v1/responses through the official openai client: text and message input, instructions,
max_output_tokens, temperature, function tools (calls as function_call items, their results sent back as
function_call_output items), the event stream `responses.create(stream=True)` reads, and what a stateless server
refuses (previous_response_id, conversation). The tiny model answers a script (server_harness.ScriptedEngine)."""

import json

import openai
import pytest
from server_harness import HTTP, openai_client
from weather_tools import WEATHER_RESPONSES

CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'


def client(server) -> openai.OpenAI:
    return openai_client(server)


def create(server, **options):
    return client(server).responses.create(**{"model": "tiny", "temperature": 0, "max_output_tokens": 300, **options})


def test_text_input_and_instructions(server, model):
    model.script.say("Hello from edgelm.")
    answer = create(server, input="Say hello", instructions="You are terse.")
    assert answer.object == "response" and answer.id.startswith("resp_") and answer.status == "completed"
    assert answer.output_text == "Hello from edgelm." and answer.instructions == "You are terse."
    assert answer.usage.output_tokens == len(model.script.script) and answer.usage.input_tokens > 0
    prompt = model.chat_template.render(
        [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hello"}]
    )
    assert answer.usage.input_tokens == len(model.encode(prompt, add_special_tokens=False))


def test_message_input_and_max_output_tokens(server, model):
    model.script.say("A long answer that will be cut short by the limit.")
    items = [{"role": "user", "content": [{"type": "input_text", "text": "Talk"}]}]
    answer = create(server, input=items, max_output_tokens=5)
    assert answer.status == "incomplete" and answer.incomplete_details.reason == "max_output_tokens"
    assert answer.usage.output_tokens == 5
    assert [item.status for item in answer.output] == ["incomplete"]  # the message is cut as its response is


def test_a_streamed_message_cut_by_max_output_tokens_is_incomplete(server, model):
    model.script.say("A long answer that will be cut short by the limit.")
    events = list(create(server, input="Talk", max_output_tokens=5, stream=True))
    assert events[-1].type == "response.incomplete" and events[-1].response.status == "incomplete"
    (done,) = [e for e in events if e.type == "response.output_item.done"]
    assert done.item.status == "incomplete" and [item.status for item in events[-1].response.output] == ["incomplete"]


def test_the_stream_has_the_events_the_client_reads(server, model):
    model.script.say("Streaming words.")
    events = list(create(server, input="Go", stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert kinds[2:5] == ["response.output_item.added", "response.content_part.added", "response.output_text.delta"]
    assert kinds[-4:-1] == ["response.output_text.done", "response.content_part.done", "response.output_item.done"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == "Streaming words." == events[-1].response.output_text
    with client(server).responses.stream(model="tiny", input="Go", temperature=0) as stream:
        final = stream.get_final_response()
    assert final.output_text == "Streaming words."


def test_function_tools_and_a_round_trip(server, model):
    model.script.say(CALL)
    answer = create(server, input="Weather in Paris?", tools=[WEATHER_RESPONSES])
    (call,) = [item for item in answer.output if item.type == "function_call"]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
    assert call.call_id.startswith("call_") and answer.status == "completed"
    model.script.say("It is 21 degrees.")
    follow_up = create(
        server,
        input=[
            {"role": "user", "content": "Weather in Paris?"},
            {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
            {"type": "function_call_output", "call_id": call.call_id, "output": '{"temperature": 21}'},
        ],
        tools=[WEATHER_RESPONSES],
    )
    assert follow_up.output_text == "It is 21 degrees."


def test_streamed_function_call_events(server, model):
    model.script.say("Checking. " + CALL)
    events = list(create(server, input="Weather in Paris?", tools=[WEATHER_RESPONSES], stream=True))
    kinds = [e.type for e in events]
    assert "response.function_call_arguments.delta" in kinds and "response.function_call_arguments.done" in kinds
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert json.loads(done.arguments) == {"city": "Paris"}
    final = events[-1].response
    assert [item.type for item in final.output] == ["message", "function_call"]
    assert final.output_text == "Checking." and final.output[1].name == "get_weather"
    indexes = [e.output_index for e in events if e.type == "response.output_item.added"]
    assert indexes == [0, 1]


@pytest.mark.parametrize(
    "body, param, words",
    [
        ({"input": "Hi", "previous_response_id": "resp_1"}, "previous_response_id", "no state is stored"),
        ({"input": "Hi", "conversation": "conv_1"}, "conversation", "no state is stored"),
        ({"input": "Hi", "background": True}, "background", "background"),
        ({}, "input", "input is required"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input[0].content[0]",
            "text only",
        ),  # fmt: skip
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type", "function_call_output"),
        ({"input": "Hi", "max_output_tokens": 0}, "max_output_tokens", ">= 1"),
        ({"input": "Hi", "text": {"format": {"type": "xml"}}}, "text.format.type", "json_schema"),
        ({"input": "Hi", "tools": [{"type": "web_search"}]}, "tools[0].type", "functions only"),
        (
            {"input": "Hi", "tools": [WEATHER_RESPONSES], "tool_choice": {"type": "function", "name": "nope"}},
            "tool_choice",
            "nope",
        ),  # fmt: skip
        ({"input": "Hi", "temprature": 1}, "temprature", "unknown field"),
    ],
)
def test_bad_requests_are_400s_naming_the_field(server, body, param, words):
    response = HTTP.post(server.url + "/v1/responses", json={"max_output_tokens": 4, **body})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and words in error["message"], error


def test_store_is_accepted_and_nothing_is_kept(server, model):
    model.script.say("Fine.")
    answer = create(server, input="Hi", store=True, metadata={"k": "v"})
    assert answer.store is False and answer.output_text == "Fine." and answer.metadata == {"k": "v"}


def test_top_logprobs_come_with_the_output_text(server, model):
    model.script.say("Hi there.")
    answer = create(server, input="Go", top_logprobs=2)
    entries = answer.output[0].content[0].logprobs
    assert "".join(e.token for e in entries) == "Hi there." and len(entries) == answer.usage.output_tokens
    assert all(len(e.top_logprobs) == 2 for e in entries)
    events = list(create(server, input="Go", top_logprobs=2, stream=True))
    streamed = [e.token for event in events if event.type == "response.output_text.delta" for e in event.logprobs]
    assert streamed == [e.token for e in entries]
