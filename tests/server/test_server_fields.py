"""Every request field of OpenAI's current chat, completions and responses schemas is taken: the server's body
models are compared with the installed openai package's request types (a new client release that adds a field
fails here, naming it), the fields without local meaning are accepted and ignored, those edgelm cannot honour
are a 400 naming the field and why, and a field no schema has is still refused."""

import pytest
from edgelm.runtime import load
from edgelm.runtime.server.api import fields
from edgelm.runtime.server.api.chat_requests import ChatBody
from edgelm.runtime.server.api.requests import CompletionBody, StreamOptions
from edgelm.runtime.server.api.responses_api import ResponsesBody, TextBody
from openai.types import completion_create_params
from openai.types.chat import chat_completion_stream_options_param
from openai.types.chat import completion_create_params as chat_params
from openai.types.responses import response_create_params, response_text_config_param
from server_harness import HTTP, InProcessServer

# edgelm's own fields, under transformers' names (docs/serve.md), beside OpenAI's.
EDGELM = {"top_k", "min_p", "typical_p", "repetition_penalty", "no_repeat_ngram_size", "min_tokens", "min_new_tokens"}
EDGELM |= {"ignore_eos", "truncate", "ban"}


def keys(*typed_dicts) -> set:
    return {k for t in typed_dicts for k in t.__required_keys__ | t.__optional_keys__}


def test_chat_takes_exactly_openais_fields_and_edgelms():
    openai_fields = keys(chat_params.CompletionCreateParamsStreaming, chat_params.CompletionCreateParamsNonStreaming)
    assert set(ChatBody.model_fields) - EDGELM == openai_fields
    assert set(StreamOptions.model_fields) == keys(
        chat_completion_stream_options_param.ChatCompletionStreamOptionsParam
    )


def test_completions_take_openais_fields_edgelms_and_response_format():
    openai_fields = keys(
        completion_create_params.CompletionCreateParamsStreaming,
        completion_create_params.CompletionCreateParamsNonStreaming,
    )
    assert set(CompletionBody.model_fields) - EDGELM - {"response_format"} == openai_fields


def test_responses_take_exactly_openais_fields():
    openai_fields = keys(
        response_create_params.ResponseCreateParamsStreaming, response_create_params.ResponseCreateParamsNonStreaming
    )
    assert set(ResponsesBody.model_fields) == openai_fields
    assert set(TextBody.model_fields) == keys(response_text_config_param.ResponseTextConfigParam)


def test_every_field_is_honoured_ignored_or_refused_once():
    for ignored, refused in ((fields.CHAT_IGNORED, fields.CHAT_REFUSED), (fields.RESPONSES_IGNORED, fields.RESPONSES_REFUSED)):  # fmt: skip
        assert not set(ignored) & set(refused)
        assert all(why and "\n" not in why for why in ignored.values())


@pytest.fixture(scope="module")
def server(tiny_package):
    s = InProcessServer(load(tiny_package), model_names=("tiny",))
    yield s
    s.stop()


MESSAGES = [{"role": "user", "content": "Hi"}]
IGNORED = {
    "metadata": {"team": "a"},
    "store": True,
    "service_tier": "flex",
    "user": "someone",
    "safety_identifier": "hash",
    "prompt_cache_key": "k",
    "prompt_cache_retention": "24h",
    "prompt_cache_options": {"mode": "implicit"},
    "reasoning_effort": "low",
    "verbosity": "low",
    "prediction": {"type": "content", "content": "Hi"},
    "modalities": ["text"],
}


@pytest.mark.parametrize("name", sorted(IGNORED))
def test_fields_without_local_meaning_are_accepted(server, name):
    body = {"messages": MESSAGES, "max_tokens": 2, name: IGNORED[name]}
    response = HTTP.post(server.url + "/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    assert name in fields.CHAT_IGNORED or name in fields.CHAT_REFUSED


REFUSED = [
    ("audio", {"voice": "alloy", "format": "wav"}, "audio output"),
    ("modalities", ["text", "audio"], "text only"),
    ("web_search_options", {}, "search the web"),
    ("moderation", {"model": "omni-moderation-latest"}, "moderation"),
    ("function_call", "auto", "tool_choice"),
]


@pytest.mark.parametrize("name, value, words", REFUSED)
def test_fields_edgelm_cannot_honour_are_a_400_naming_them(server, name, value, words):
    response = HTTP.post(server.url + "/v1/chat/completions", json={"messages": MESSAGES, name: value})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == name and words in error["message"] and error["code"] == "unsupported_field", error


def test_content_parts_other_than_text_are_refused(server):
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "What is it?"}, image]}]}
    error = HTTP.post(server.url + "/v1/chat/completions", json=body).json()["error"]
    assert error["param"] == "messages[0].content[1]" and "text only" in error["message"]


FIRST = {"/v1/chat/completions": {"messages": MESSAGES}, "/v1/completions": {"prompt": "Hi"}, "/v1/responses": {"input": "Hi"}}  # fmt: skip


@pytest.mark.parametrize("path", sorted(FIRST))
def test_a_field_no_schema_has_is_still_refused(server, path):
    error = HTTP.post(server.url + path, json={**FIRST[path], "stream_mode": "fast"}).json()["error"]
    assert error["param"] == "stream_mode" and "unknown field" in error["message"]
