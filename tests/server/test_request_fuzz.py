"""Fuzzing of what a client sends: JSON bodies for POST /v1/completions, /v1/chat/completions, /v1/responses,
/v1/score, /tokenize and /detokenize
(valid requests mutated: wrong types, huge and negative numbers, NaN-like strings, lone surrogates, deep nesting,
unknown fields, ids out of range, empty lists, long stop lists), sent in-process to the ASGI app over the tiny
package; and the Python API's options. The server answers 200 with the response's shape or a 4xx in OpenAI's
error shape, never a 5xx; `model.generate` returns a Completion or raises an EdgelmError, nothing else.

Hypothesis runs derandomized with a bounded number of examples, so every run (and CI) tries the same cases."""

import asyncio
import json

import httpx
import pytest
from edgelm.runtime.batching.batch import Completion
from edgelm.runtime.errors import EdgelmError
from edgelm.runtime.server.api.requests import Limits
from edgelm.runtime.server.app import create_app
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

FUZZ = settings(
    max_examples=120,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)
DEEP = "__deep__"  # replaced in the written text by a list nested DEPTH deep (json.dumps itself would recurse)
DEPTH = 100_000
VOCAB = 320  # the tiny package's vocabulary (tests/support/checkpoints.py)

ODD_STRINGS = ["", "NaN", "Infinity", "-Infinity", "nan", "1e309", "0x10", "5", "true", "null", "a\ud800b", "\udfff"]
ODD_STRINGS += ["\x00", "<|endoftext|>", "é" * 50, "x" * 5000, "\u202e", "\r\n", "%0d%0a", "../../etc/passwd"]
NUMBERS = [0, -1, 1, 2, 63, 64, 65, VOCAB - 1, VOCAB, -VOCAB, 2**31, 2**63, -(2**63), 10**30, 10**400]
NUMBERS += [0.5, -0.0, 1e-42, 1e-300, 1e308, -1e308, 3.5, 100.0, 101.0, float("nan"), float("inf"), float("-inf")]
ODD = [None, True, False, [], {}, [[]], {"a": 1}, [1, "a"], [None], DEEP, *ODD_STRINGS, *NUMBERS]

FIELDS = {
    "/v1/completions": [
        "model", "prompt", "max_tokens", "temperature", "top_p", "n", "stream", "stream_options", "stop", "seed",
        "logprobs", "echo", "frequency_penalty", "presence_penalty", "logit_bias", "user", "best_of", "suffix",
        "top_k", "min_p", "typical_p", "repetition_penalty", "no_repeat_ngram_size", "min_tokens",
        "min_new_tokens", "ignore_eos", "truncate",
    ],
    "/v1/chat/completions": [
        "model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "n", "stream",
        "stream_options", "stop", "seed", "logprobs", "top_logprobs", "logit_bias", "response_format", "tools",
        "tool_choice", "parallel_tool_calls", "store", "metadata", "modalities", "audio", "user", "top_k",
    ],
    "/v1/responses": [
        "model", "input", "instructions", "max_output_tokens", "temperature", "top_p", "stream", "text", "tools",
        "tool_choice", "parallel_tool_calls", "truncation", "top_logprobs", "store", "previous_response_id",
    ],
    "/v1/score": ["text", "model"],
    "/tokenize": ["content", "add_special", "with_pieces"],
    "/detokenize": ["tokens"],
}  # fmt: skip
VALID = {
    "/v1/completions": {"prompt": "Hello there", "max_tokens": 4, "temperature": 0},
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4, "temperature": 0},
    "/v1/responses": {"input": "Hello", "max_output_tokens": 4, "temperature": 0},
    "/v1/score": {"text": "Hello there"},
    "/tokenize": {"content": "Hello there"},
    "/detokenize": {"tokens": [1, 2, 3]},
}

token_ids = st.lists(st.sampled_from([0, 1, 5, VOCAB - 1, VOCAB, -1, 2**40]), max_size=8)
scalars = st.one_of(
    st.sampled_from(ODD),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=30),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=3), token_ids
    ),
    max_leaves=12,
)
# Values that fit some field's type, so the body reaches the runtime's checks rather than stopping at the schema.
plausible = st.one_of(
    st.integers(min_value=-3, max_value=80),
    st.floats(min_value=-3, max_value=200, allow_nan=False),
    st.booleans(),
    st.sampled_from(["Hi", "", "\n", "<|endoftext|>", "a\ud800b", "gpt2", "tiny-fp32"]),
    token_ids,
    st.lists(token_ids, max_size=3),
    st.lists(st.sampled_from(["a", "", " ", "e", "\ud800", "x" * 100]), max_size=50),  # stop lists
    st.dictionaries(st.sampled_from(["0", "5", "319", "320", "-1", "x", "00", "1e3"]), st.sampled_from(NUMBERS[:20])),
    st.fixed_dictionaries({}, optional={"include_usage": st.sampled_from([True, False, 1, None])}),
    st.sampled_from(  # the shapes of messages, response formats and tools, each a little wrong or not at all
        [
            [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": None}],
            [{"role": "tool", "tool_call_id": "x", "content": "1"}],
            [{"role": "user", "content": [{"type": "input_image"}]}],
            {"type": "json_object"},
            {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}},
            {"type": "json_schema", "json_schema": {"schema": {"type": "nonsense"}}},
            {"format": {"type": "json_schema", "name": "x", "schema": {"type": "array", "maxItems": 2}}},
            [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
            [{"type": "function", "name": "f", "parameters": {"type": "object", "properties": {"a": 5}}}],
            "required",
            {"type": "function", "function": {"name": "f"}},
            {"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": []}},
            [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{"}],
        ]
    ),
)


@st.composite
def mutated_bodies(draw, endpoint: str):
    """A valid body for `endpoint` with one to four fields set to hostile values (or added, unknown), or a
    body that is not an object at all."""
    if draw(st.integers(0, 19)) == 0:
        return draw(st.sampled_from([[], "body", 5, None, DEEP, [VALID[endpoint]]]))
    body = dict(VALID[endpoint])
    for _ in range(draw(st.integers(1, 4))):
        name = draw(st.one_of(st.sampled_from(FIELDS[endpoint]), st.sampled_from(["unknown", "\ud800", ""])))
        if draw(st.booleans()):
            body[name] = draw(plausible)
        elif draw(st.integers(0, 9)) == 0:
            body.pop(name, None)
        else:
            body[name] = draw(values)
    return body


def encode(body) -> bytes:
    text = json.dumps(body, ensure_ascii=True, allow_nan=True)  # NaN and Infinity as a sloppy client writes them
    return text.replace(json.dumps(DEEP), "[" * DEPTH + "]" * DEPTH).encode()


@pytest.fixture(scope="module")
def client(model):
    """A client of the app over the tiny package, on one event loop kept for the module; limits kept small so
    that the largest valid request still runs in a moment."""
    app = create_app(model, Limits(max_tokens=16, max_n=4, max_prompts=4, max_batch_tokens=2048))
    loop = asyncio.new_event_loop()
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1")

    def post(path: str, content: bytes) -> httpx.Response:
        headers = {"Content-Type": "application/json"}
        return loop.run_until_complete(asyncio.wait_for(http.post(path, content=content, headers=headers), 60))

    yield post
    loop.run_until_complete(http.aclose())
    loop.close()


def check_error_shape(body: dict) -> None:
    assert set(body) == {"error"}, body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"] and "\n" not in error["message"], error
    assert error["type"] != "server_error", error
    assert error["param"] is None or isinstance(error["param"], str), error


def check_chat_shape(body: dict) -> None:
    assert body["object"] in ("chat.completion", "chat.completion.chunk"), body
    for choice in body["choices"]:
        assert choice["finish_reason"] in (None, "stop", "length", "tool_calls"), choice


def check_completion_shape(body: dict) -> None:
    assert body["object"] == "text_completion" and isinstance(body["id"], str), body
    for choice in body["choices"]:
        assert isinstance(choice["text"], str) and isinstance(choice["index"], int), choice
        assert choice["finish_reason"] in (None, "stop", "length"), choice


def check_answer(endpoint: str, body, response: httpx.Response) -> None:
    assert response.status_code == 200 or 400 <= response.status_code < 500, (body, response.text[:500])
    if response.status_code != 200:
        return check_error_shape(response.json())
    if (
        endpoint.startswith("/v1/")
        and endpoint != "/v1/score"
        and isinstance(body, dict)
        and body.get("stream") is True
    ):
        events = [line[len("data: ") :] for line in response.text.splitlines() if line.startswith("data: ")]
        assert events, response.text[:500]
        if endpoint == "/v1/responses":  # named events; a failed stream ends with an "error" event
            last = json.loads(events[-1])
            assert last["type"] in ("response.completed", "response.incomplete", "error"), last
            return
        check = check_chat_shape if endpoint == "/v1/chat/completions" else check_completion_shape
        for data in events[:-1]:
            check(json.loads(data))
        if events[-1] != "[DONE]":  # a stream that failed after it began ends with an error event
            check_error_shape(json.loads(events[-1]))
        return
    answer = response.json()
    if endpoint == "/v1/chat/completions":
        check_chat_shape(answer)
    elif endpoint == "/v1/responses":
        assert answer["object"] == "response" and answer["status"] in ("completed", "incomplete"), answer
    elif endpoint == "/v1/completions":
        check_completion_shape(answer)
        assert set(answer["usage"]) == {"prompt_tokens", "completion_tokens", "total_tokens"}, answer
    elif endpoint == "/v1/score":
        assert answer["object"] == "score" and len(answer["tokens"]) == len(answer["token_ids"]), answer
    elif endpoint == "/tokenize":
        assert all(isinstance(i, int) and 0 <= i < VOCAB for i in answer["tokens"]), answer
    else:
        assert isinstance(answer["content"], str), answer


@pytest.mark.parametrize("endpoint", sorted(FIELDS))
def test_mutated_request_bodies_get_an_answer_or_a_4xx_in_openai_shape(client, endpoint):
    @FUZZ
    @given(body=mutated_bodies(endpoint))
    def run(body):
        check_answer(endpoint, body, client(endpoint, encode(body)))

    run()


@pytest.mark.parametrize("endpoint", sorted(FIELDS))
def test_each_valid_body_is_answered_with_its_shape(client, endpoint):
    """The fuzz's starting points are themselves served (a fuzz that only ever got 400s would prove little)."""
    response = client(endpoint, encode(VALID[endpoint]))
    assert response.status_code == 200, response.text
    check_answer(endpoint, VALID[endpoint], response)


OPTIONS = [
    "max_new_tokens", "min_new_tokens", "do_sample", "temperature", "top_k", "top_p", "min_p", "typical_p",
    "repetition_penalty", "no_repeat_ngram_size", "frequency_penalty", "presence_penalty", "logit_bias",
    "bad_words_ids", "ignore_eos", "stop", "num_return_sequences", "seed", "logprobs", "truncate",
    "eos_token_id", "pad_token_id", "vocab_size", "config", "unknown_option",
]  # fmt: skip
python_values = st.one_of(
    plausible,
    st.sampled_from([None, 5, -5, 10**6, 10**30, 1e-42, 1e-300, float("nan"), float("inf"), "5", b"x", object()]),
    st.sampled_from([{"x": 1}, {5: "a"}, {1: float("nan")}, {10**9: 1.0}, [[1, 2], [VOCAB]], [[]], ((1,),), {1, 2}]),
    values,
)


@FUZZ
@example(prompt="a\ud800b", options={})  # text that is not Unicode: a PromptError, not tokenizers' TypeError
@example(prompt="hi", options={"do_sample": True, "temperature": 1e-42})  # non-finite logits reach the sampler
@example(prompt="hi", options={"do_sample": True, "repetition_penalty": 1e-300})
@example(prompt=[[1, 2], "x"], options={"num_return_sequences": 10**6})  # bounded before anything is allocated
@given(
    prompt=st.one_of(st.sampled_from(["hi", "", "a\ud800b", 5, None, [], [1, 2], [[1], "x"], [VOCAB]]), st.text()),
    options=st.dictionaries(st.sampled_from(OPTIONS), python_values, max_size=4),
)
def test_generate_returns_a_completion_or_raises_a_typed_error(model, prompt, options):
    options.setdefault("max_new_tokens", 4)  # bounded work for the valid cases; a hostile value may replace it
    try:
        result = model.generate(prompt, **options)
    except EdgelmError:
        return
    results = result if isinstance(result, list) else [result]
    flat = [c for r in results for c in (r if isinstance(r, list) else [r])]
    assert flat and all(isinstance(c, Completion) for c in flat), result


@FUZZ
@given(options=st.dictionaries(st.sampled_from(OPTIONS), python_values, min_size=1, max_size=3))
def test_generate_hi_with_random_options(model, options):
    options.setdefault("max_new_tokens", 4)
    try:
        result = model.generate("hi", **options)
    except EdgelmError:
        return
    if options.get("num_return_sequences", 1) == 1:
        assert isinstance(result, Completion), result
    else:
        assert all(isinstance(c, Completion) for c in result), result
