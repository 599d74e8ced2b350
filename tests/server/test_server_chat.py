"""POST /v1/chat/completions through real HTTP: the official openai client (sync and async, streamed and not),
n, stop, seed, logprobs, OpenAI's chunk shapes, bad requests answered in OpenAI's error shape with the field
named, and CORS on the chat path. Every answer is checked against Model.chat in this process."""

import asyncio
import json

import httpx
import openai
import pytest
from edgelm.runtime import load
from edgelm.runtime.server.api.requests import Limits
from edgelm.runtime.text.chat_template import ChatTemplate
from server_harness import HTTP, InProcessServer, gate

MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hello there"}]


@pytest.fixture(scope="module")
def server(model):
    s = InProcessServer(model, Limits(max_tokens=40), model_names=("tiny-chat",))
    yield s
    s.stop()


def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def chat(server, body: dict, **headers):
    return HTTP.post(server.url + "/v1/chat/completions", json=body, headers=headers)


def chat_events(server, body: dict) -> list:
    """Every `data:` payload of a streamed chat request, parsed; the final "[DONE]" kept as a string."""
    events = []
    with HTTP.stream("POST", server.url + "/v1/chat/completions", json={**body, "stream": True}) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line.startswith("data: "):
                data = line[len("data: ") :]
                events.append(data if data == "[DONE]" else json.loads(data))
    return events


def greedy(model, messages=MESSAGES, **options):
    return model.chat(messages, max_new_tokens=options.pop("max_new_tokens", 12), do_sample=False, **options)


# -- answers equal Model.chat ----------------------------------------------------------------------------


def test_greedy_chat_equals_model_chat(server, model):
    expected = greedy(model)
    answer = client(server).chat.completions.create(model="tiny-chat", messages=MESSAGES, max_tokens=12, temperature=0)
    assert answer.object == "chat.completion" and answer.id.startswith("chatcmpl-")
    assert answer.model == "tiny-chat"
    choice = answer.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == expected.text.lstrip()  # the default template's answers begin with a space
    assert choice.finish_reason == expected.finish_reason
    assert answer.usage.prompt_tokens == expected.prompt_tokens
    assert answer.usage.completion_tokens == expected.completion_tokens
    # max_completion_tokens is the same option
    again = client(server).chat.completions.create(
        model="tiny-chat", messages=MESSAGES, max_completion_tokens=12, temperature=0
    )
    assert again.choices[0].message.content == choice.message.content


def test_without_max_tokens_the_answer_may_fill_the_context(server, model):
    body = chat(server, {"messages": MESSAGES, "temperature": 0, "ignore_eos": True}).json()
    room = model.arch.n_positions - len(model.encode(model.chat_template.render(MESSAGES)))
    expected = greedy(model, max_new_tokens=min(40, room), ignore_eos=True)  # 40: the server's --max-tokens-limit
    assert expected.completion_tokens == min(40, room)
    assert body["choices"][0]["message"]["content"] == expected.text.lstrip()
    assert body["usage"]["completion_tokens"] == expected.completion_tokens


def test_stream_has_openais_chunk_shapes(server, model):
    expected = greedy(model)
    events = chat_events(
        server, {"messages": MESSAGES, "max_tokens": 12, "temperature": 0, "stream_options": {"include_usage": True}}
    )
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)
    assert chunks[0]["choices"] == [
        {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
    ]
    assert all(c["usage"] is None for c in chunks[:-1]) and chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["completion_tokens"] == expected.completion_tokens
    last = chunks[-2]["choices"][0]
    assert last["delta"] == {} and last["finish_reason"] == expected.finish_reason
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[1:-2])
    assert text == expected.text.lstrip()
    assert not any(
        "usage" in c and c["usage"] for c in chat_events(server, {"messages": MESSAGES, "max_tokens": 3})[:-1]
    )


def test_openai_client_sync_and_async_streamed_and_not(server, model):
    expected = greedy(model).text.lstrip()
    options = dict(model="tiny-chat", messages=MESSAGES, max_tokens=12, temperature=0)
    streamed = client(server).chat.completions.create(**options, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == expected

    async def both():
        async with openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0) as aclient:
            whole = await aclient.chat.completions.create(**options)
            stream = await aclient.chat.completions.create(**options, stream=True)
            return whole.choices[0].message.content, "".join([c.choices[0].delta.content or "" async for c in stream])

    assert asyncio.run(both()) == (expected, expected)


def test_n_choices_and_seed_reproducibility(server, model):
    options = dict(messages=MESSAGES, max_tokens=10, n=3, seed=7, temperature=1.0)
    one = client(server).chat.completions.create(model="tiny-chat", **options, extra_body={"ignore_eos": True})
    two = client(server).chat.completions.create(model="tiny-chat", **options, extra_body={"ignore_eos": True})
    assert [c.index for c in one.choices] == [0, 1, 2]
    assert [c.message.content for c in one.choices] == [c.message.content for c in two.choices]
    assert len({c.message.content for c in one.choices}) > 1  # each choice its own sample
    expected = model.chat(MESSAGES, max_new_tokens=10, num_return_sequences=3, seed=7, do_sample=True, top_k=0,
                          top_p=1.0, ignore_eos=True)  # fmt: skip
    assert [c.message.content for c in one.choices] == [c.text.lstrip() for c in expected]
    events = chat_events(server, {**options, "ignore_eos": True})
    texts = ["", "", ""]
    for event in events[:-1]:
        for c in event["choices"]:
            texts[c["index"]] += c["delta"].get("content") or ""
    assert texts == [c.message.content for c in one.choices]


def test_stop(server, model):
    text = greedy(model, ignore_eos=True).text.lstrip()
    stop = text[4:6]
    expected = greedy(model, ignore_eos=True, stop=[stop])
    answer = chat(server, {"messages": MESSAGES, "max_tokens": 12, "temperature": 0, "stop": stop, "ignore_eos": True})
    choice = answer.json()["choices"][0]
    assert choice["message"]["content"] == expected.text.lstrip() and stop not in choice["message"]["content"]
    assert choice["finish_reason"] == "stop"


def test_logprobs(server, model):
    expected = greedy(model, logprobs=2).logprobs
    answer = client(server).chat.completions.create(
        model="tiny-chat", messages=MESSAGES, max_tokens=12, temperature=0, logprobs=True, top_logprobs=2
    )
    content = answer.choices[0].logprobs.content
    assert [e.token for e in content] == [e["token"] for e in expected]
    assert [e.logprob for e in content] == pytest.approx([e["logprob"] for e in expected], abs=1e-5)
    assert all(len(e.top_logprobs) == 2 and e.bytes == list(e.token.encode()) for e in content)
    plain = client(server).chat.completions.create(
        model="tiny-chat", messages=MESSAGES, max_tokens=3, temperature=0, logprobs=True
    )
    assert all(e.top_logprobs == [] for e in plain.choices[0].logprobs.content)
    assert (
        client(server).chat.completions.create(model="tiny-chat", messages=MESSAGES, max_tokens=3).choices[0].logprobs
        is None
    )
    streamed = client(server).chat.completions.create(
        model="tiny-chat", messages=MESSAGES, max_tokens=12, temperature=0, logprobs=True, top_logprobs=2, stream=True
    )
    tokens = [e.token for c in streamed if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert tokens == [e.token for e in content]


def test_content_parts_and_developer_role(server, model):
    parts = [{"role": "developer", "content": "You are terse."}, {"role": "user", "content": [{"type": "text", "text": "Hello there"}]}]  # fmt: skip
    answer = chat(server, {"messages": parts, "max_tokens": 12, "temperature": 0, "user": "someone"}).json()
    assert answer["choices"][0]["message"]["content"] == greedy(model).text.lstrip()


# -- the completions' queue and cancellation -------------------------------------------------------------


@pytest.fixture
def gated(tiny_package):
    """One slot, no queue, and a decoder that waits at a gate the test holds and releases."""
    model = load(tiny_package)
    engine = gate(model)
    s = InProcessServer(model, Limits(max_tokens=50), max_batch=1, max_queue=0)
    s.engine = engine
    yield s
    engine.release()
    s.stop()


HELD = {"messages": MESSAGES, "max_tokens": 20, "ignore_eos": True, "temperature": 0}


def test_queue_full_is_429_and_a_chat_stream_that_leaves_frees_its_slot(gated):
    before = gated.health()["cancelled"]
    gated.engine.hold()
    with HTTP.stream("POST", gated.url + "/v1/chat/completions", json={**HELD, "stream": True}) as held:
        lines = held.iter_lines()  # kept: dropping a half-read iterator closes the connection
        next(lines)  # the role chunk: the held request has the only slot
        response = chat(gated, {"messages": MESSAGES, "max_tokens": 2})
        assert response.status_code == 429 and response.headers["retry-after"] == "1", response.text
        assert response.json()["error"]["code"] == "queue_full"
    gated.wait_until_stopped("cancelled")
    gated.engine.release()
    assert gated.idle("cancelled", before)["cancelled"] == before + 1
    assert chat(gated, {"messages": MESSAGES, "max_tokens": 2}).status_code == 200


def test_a_chat_client_that_leaves_before_the_answer_stops_its_generation(gated):
    before = gated.health()["cancelled"]
    gated.engine.hold()
    with pytest.raises(httpx.ReadTimeout):
        HTTP.post(gated.url + "/v1/chat/completions", json=HELD, timeout=0.5)
    gated.wait_until_stopped("cancelled")
    gated.engine.release()
    health = gated.idle("cancelled", before)
    assert health["active"] == 0 and health["cancelled"] == before + 1


# -- bad requests ----------------------------------------------------------------------------------------

BAD = [
    ({}, "messages", "required"),
    ({"messages": "Hi"}, "messages", "must be a list"),
    ({"messages": []}, "messages", "empty"),
    ({"messages": [{"role": "bot", "content": "Hi"}]}, "messages[0].role", "must be one of"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content", "must be a string"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0].content[0]", "text part"),
    ({"messages": [{"role": "user", "content": "\ud800"}]}, "messages", "lone surrogate"),
    ({"messages": MESSAGES, "logit_bias": {"100000": 1}}, "logit_bias", "token ids"),
    ({"messages": MESSAGES, "function": []}, "function", "unknown field"),
    ({"messages": MESSAGES, "functions": []}, "functions", "send tools"),
    ({"messages": MESSAGES, "top_logprobs": 2}, "top_logprobs", "logprobs: true"),
    ({"messages": MESSAGES, "logprobs": True, "top_logprobs": 21}, "top_logprobs", "0 to 20"),
    ({"messages": MESSAGES, "logprobs": 2}, "logprobs", "true or false"),
    ({"messages": MESSAGES, "max_tokens": 0}, "max_tokens", ">= 1"),
    ({"messages": MESSAGES, "max_completion_tokens": 41}, "max_completion_tokens", "at most 40"),
    ({"messages": MESSAGES, "max_tokens": 3, "max_completion_tokens": 4}, "max_tokens", "not both"),
    ({"messages": MESSAGES, "n": 9}, "n", "from 1 to 8"),
    ({"messages": MESSAGES, "temperature": -1}, "temperature", "temperature"),
    ({"messages": MESSAGES, "stream_options": {"include_usage": True}}, "stream_options", "stream: true"),
    ({"messages": MESSAGES, "model": "gpt-4"}, "model", "does not exist"),
]


@pytest.mark.parametrize("body, param, words", BAD)
def test_bad_requests_name_the_field(server, body, param, words):
    response = HTTP.post(
        server.url + "/v1/chat/completions", content=json.dumps(body), headers={"Content-Type": "application/json"}
    )
    assert response.status_code == (404 if param == "model" else 400), response.text
    error = response.json()["error"]
    assert error["param"] == param and words in error["message"], error
    assert error["type"] == "invalid_request_error"


def test_a_conversation_longer_than_the_context_is_refused(server):
    long = [{"role": "user", "content": "word " * 200}]
    error = chat(server, {"messages": long, "max_tokens": 4}).json()["error"]
    assert error["param"] == "messages" and "context" in error["message"]


def test_a_template_that_fails_to_render_is_a_400_naming_messages(tiny_package):
    model = load(tiny_package)
    model.chat_template = ChatTemplate("{{ raise_exception('Conversation roles must alternate') }}")
    s = InProcessServer(model, model_names=("tiny-chat",))
    try:
        with pytest.raises(openai.BadRequestError) as refused:
            client(s).chat.completions.create(model="tiny-chat", messages=MESSAGES, max_tokens=2)
        assert refused.value.body["param"] == "messages"
        assert "Conversation roles must alternate" in refused.value.body["message"]
    finally:
        s.stop()


# -- CORS on the chat path -------------------------------------------------------------------------------

ASK = {"Origin": "http://app.example", "Access-Control-Request-Method": "POST"}


def test_no_cors_on_chat_by_default(server):
    preflight = HTTP.options(server.url + "/v1/chat/completions", headers=ASK)
    assert preflight.status_code != 200 and "access-control-allow-origin" not in preflight.headers
    answer = chat(server, {"messages": MESSAGES, "max_tokens": 1}, Origin="http://app.example")
    assert answer.status_code == 200 and "access-control-allow-origin" not in answer.headers


def test_allow_origin_opens_chat_to_that_origin(model):
    s = InProcessServer(model, allow_origins=("http://app.example",))
    try:
        preflight = HTTP.options(s.url + "/v1/chat/completions", headers=ASK)
        assert preflight.status_code == 200
        assert preflight.headers["access-control-allow-origin"] == "http://app.example"
        answer = chat(s, {"messages": MESSAGES, "max_tokens": 1}, Origin="http://app.example")
        assert answer.status_code == 200 and answer.headers["access-control-allow-origin"] == "http://app.example"
        other = HTTP.options(s.url + "/v1/chat/completions", headers={**ASK, "Origin": "http://evil.example"})
        assert "access-control-allow-origin" not in other.headers
    finally:
        s.stop()
