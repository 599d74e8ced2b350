"""`edgelm serve` end to end: the real server in a subprocess, spoken to with httpx and the official openai client.

Every answer is checked against Model.generate in this process with the same options: a request's
output must not depend on HTTP, streaming, or what else the server is running. What the server refuses and how a
request ends early are in test_server_limits.py.
"""

import dataclasses
import json
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
from edgelm.runtime import load
from edgelm.runtime.batching.prefix_cache import CLI_DEFAULT_MB
from edgelm.runtime.server.app import jobs_for
from server_harness import HTTP, InProcessServer, Server, complete, stream_events, streamed_texts

PROMPTS = ["Hello", "The quick brown fox", "Once upon a time", "import numpy as np\n", ""]


@pytest.fixture(scope="module")
def server(tiny_package, tmp_path_factory):
    """Default limits; a running batch of up to four rows (more requests wait for a place)."""
    s = Server(tiny_package, tmp_path_factory.mktemp("server"), "--max-batch", "4")
    yield s
    assert s.stop() == 0, s.log()


# -- answers equal Model.generate ------------------------------------------------------------------------


def test_health_and_models(server, model):
    assert server.health()["status"] == "ok"
    listing = HTTP.get(server.url + "/v1/models").json()
    assert [m["id"] for m in listing["data"]] == [model.package.name]
    # the package's name, never the folder the server keeps it in
    assert [m["root"] for m in listing["data"]] == [model.package.name]
    assert str(model.package.folder.parent) not in json.dumps(listing)
    assert HTTP.get(f"{server.url}/v1/models/{model.package.name}").json()["id"] == model.package.name


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_equals_generate(server, model, prompt):
    expected = model.generate(prompt, max_new_tokens=20, do_sample=False)
    body = complete(server, {"model": model.package.name, "prompt": prompt, "max_tokens": 20, "temperature": 0}).json()
    assert (
        body["object"] == "text_completion" and body["id"].startswith("cmpl-") and body["model"] == model.package.name
    )
    assert body["choices"][0]["text"] == expected.text
    assert body["choices"][0]["finish_reason"] == expected.finish_reason
    assert body["usage"] == {
        "prompt_tokens": expected.prompt_tokens,
        "completion_tokens": expected.completion_tokens,
        "total_tokens": expected.prompt_tokens + expected.completion_tokens,
    }
    assert streamed_texts(stream_events(server, {"prompt": prompt, "max_tokens": 20, "temperature": 0}))[0] == [
        expected.text
    ]


def test_seeded_sampling_with_several_prompts_and_n(server, model):
    options = dict(temperature=0.8, top_p=0.9, seed=7)
    expected = model.generate(
        PROMPTS[:2], max_new_tokens=16, do_sample=True, top_k=0, num_return_sequences=3, **options
    )
    body = complete(server, {"prompt": PROMPTS[:2], "max_tokens": 16, "n": 3, **options}).json()
    assert [c["index"] for c in body["choices"]] == list(range(6))
    assert [c["text"] for c in body["choices"]] == [c.text for c in expected]
    texts, reasons = streamed_texts(
        stream_events(server, {"prompt": PROMPTS[:2], "max_tokens": 16, "n": 3, **options}), rows=6
    )
    assert texts == [c.text for c in expected] and reasons == [c.finish_reason for c in expected]


def test_openai_client_streaming_and_not(server, model):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    expected = model.generate("Once upon a time", max_new_tokens=24, do_sample=True, top_k=0, temperature=1.0, seed=3)
    answer = client.completions.create(model=model.package.name, prompt="Once upon a time", max_tokens=24, seed=3)
    assert answer.choices[0].text == expected.text and answer.usage.completion_tokens == expected.completion_tokens
    chunks = list(
        client.completions.create(
            model=model.package.name, prompt="Once upon a time", max_tokens=24, seed=3, stream=True
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == expected.text
    assert chunks[-1].choices[0].finish_reason == expected.finish_reason
    extras = dict(top_k=5, repetition_penalty=1.3, no_repeat_ngram_size=2, min_tokens=4)
    expected = model.generate(
        "Hello",
        max_new_tokens=12,
        do_sample=True,
        temperature=0.7,
        seed=1,
        min_new_tokens=4,
        **{k: v for k, v in extras.items() if k != "min_tokens"},
    )
    answer = client.completions.create(
        model=model.package.name, prompt="Hello", max_tokens=12, temperature=0.7, seed=1, extra_body=extras
    )
    assert answer.choices[0].text == expected.text


def test_stop_logit_bias_and_penalties_map_to_the_runtime(server, model):
    greedy = model.generate("Hello", max_new_tokens=20)
    stop = greedy.text[3:6]
    expected = model.generate(
        "Hello", max_new_tokens=20, stop=[stop], frequency_penalty=0.5, presence_penalty=0.3, logit_bias={5: 3.0}
    )
    body = complete(
        server,
        {
            "prompt": "Hello",
            "max_tokens": 20,
            "temperature": 0,
            "stop": stop,
            "frequency_penalty": 0.5,
            "presence_penalty": 0.3,
            "logit_bias": {"5": 3},
        },
    ).json()
    assert body["choices"][0]["text"] == expected.text and body["choices"][0]["finish_reason"] == expected.finish_reason


def test_logprobs_in_openai_legacy_shape(server, model):
    expected = model.generate("Hello", max_new_tokens=8, logprobs=3)
    choice = complete(server, {"prompt": "Hello", "max_tokens": 8, "temperature": 0, "logprobs": 3}).json()["choices"][
        0
    ]
    lp = choice["logprobs"]
    assert lp["tokens"] == [e["token"] for e in expected.logprobs]
    assert lp["token_logprobs"] == pytest.approx([e["logprob"] for e in expected.logprobs])
    assert all(
        len(top) <= 3 and max(top.values()) >= v - 1e-6 for top, v in zip(lp["top_logprobs"], lp["token_logprobs"])
    )
    # offsets count from the start of the prompt, as OpenAI's: the completion begins at len("Hello")
    assert lp["text_offset"][0] == len("Hello") and len(lp["text_offset"]) == len(lp["tokens"])
    # streamed: each chunk carries the log-probs of its own tokens; together they are the same
    events = stream_events(server, {"prompt": "Hello", "max_tokens": 8, "temperature": 0, "logprobs": 3})
    streamed = [e["choices"][0]["logprobs"] for e in events[:-1] if e["choices"]]
    assert [t for chunk in streamed for t in chunk["tokens"]] == lp["tokens"]
    assert [o for chunk in streamed for o in chunk["text_offset"]] == lp["text_offset"]


def test_echo_with_max_tokens_0_scores_the_prompt(server, model):
    score = model.score("The quick brown fox")
    choice = complete(server, {"prompt": "The quick brown fox", "max_tokens": 0, "echo": True, "logprobs": 0}).json()[
        "choices"
    ][0]
    assert choice["text"] == "The quick brown fox"
    assert choice["logprobs"]["tokens"] == score.tokens
    assert choice["logprobs"]["token_logprobs"] == pytest.approx(score.logprobs)
    echoed = complete(server, {"prompt": "Hello", "max_tokens": 5, "temperature": 0, "echo": True}).json()["choices"][
        0
    ]["text"]
    assert echoed == "Hello" + model.generate("Hello", max_new_tokens=5).text


def test_score_endpoint(server, model):
    expected = model.score("Once upon a time")
    body = HTTP.post(server.url + "/v1/score", json={"text": "Once upon a time"}).json()
    assert body["tokens"] == expected.tokens and body["perplexity"] == pytest.approx(expected.perplexity)
    assert body["token_logprobs"] == pytest.approx(expected.logprobs)


# -- many clients ----------------------------------------------------------------------------------------


def test_16_streaming_clients_64_requests_all_complete_and_equal_serial_results(server, model):
    cases = [(p, seed) for p in PROMPTS for seed in (None, 1, 2, 3)]  # None: greedy
    expected = {}
    for prompt, seed in cases:
        options = dict(do_sample=False) if seed is None else dict(do_sample=True, top_k=0, seed=seed)
        expected[prompt, seed] = model.generate(prompt, max_new_tokens=16, **options).text

    def one(i):
        prompt, seed = cases[i % len(cases)]
        body = {"prompt": prompt, "max_tokens": 16, **({"temperature": 0} if seed is None else {"seed": seed})}
        texts, _ = streamed_texts(stream_events(server, body))
        return texts[0] == expected[prompt, seed]

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(one, range(64)))  # 4 rounds per client: rows join and leave a running batch
    assert all(results), f"{results.count(False)} of 64 streams differed from their serial result"
    health = server.idle()
    assert health["active"] == 0 and health["queued"] == 0


def test_without_continuous_batching_each_request_runs_alone_in_a_thread(tiny_package):
    """--max-batch 0 (and CUDA, and graphs that do not update their cache in place): a worker thread per request."""
    model = load(tiny_package)
    s = InProcessServer(model, max_batch=0, max_concurrency=2)
    try:
        assert s.app.jobs.scheduler is None
        expected = model.generate(PROMPTS[2], max_new_tokens=8, do_sample=False, logprobs=2)
        body = {"prompt": PROMPTS[2], "max_tokens": 8, "temperature": 0, "logprobs": 2}
        choice = complete(s, body).json()["choices"][0]
        assert choice["text"] == expected.text
        assert choice["logprobs"]["tokens"] == [e["token"] for e in expected.logprobs]
        assert streamed_texts(stream_events(s, body))[0] == [expected.text]
    finally:
        s.stop()
    growing = load(tiny_package)
    growing.engine.io = dataclasses.replace(growing.engine.io, kv_cache_in_place=False)
    assert jobs_for(growing, 16, 2, 64).scheduler is None and jobs_for(model, 16, 2, 64).scheduler is not None


# -- limits and bad requests -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body, param, words",
    [
        ({"prompt": "Hi", "max_token": 5}, "max_token", "unknown field"),
        ({"prompt": "Hi", "max_tokens": "5"}, "max_tokens", "must be an integer"),
        ({"prompt": 5}, "prompt", "must be a string or a list of strings"),
        ({"prompt": "Hi", "stream": "yes"}, "stream", "true or false"),
        ({"prompt": "Hi", "temperature": -1}, "temperature", "temperature must be a number >= 0"),
        ({"prompt": "Hi", "top_p": 2}, "top_p", "top_p must be in (0, 1]"),
        ({"prompt": "Hi", "n": 9}, "n", "--max-n"),
        ({"prompt": "Hi", "max_tokens": 65}, "max_tokens", "--max-tokens-limit"),
        ({"prompt": "Hi", "max_tokens": 0}, "max_tokens", "only with echo"),
        ({"prompt": "Hi " * 60, "max_tokens": 16}, "prompt", "context"),
        ({"prompt": "Hi", "logit_bias": {"x": 1}}, "logit_bias", "token ids"),
        ({"prompt": "Hi", "logprobs": 21}, "logprobs", "logprobs must be an integer from 0 to 20"),
        ({"prompt": "Hi", "min_tokens": 3, "min_new_tokens": 3}, "min_tokens", "not both"),
        ({"prompt": "Hi", "stream_options": {"include_usage": True}}, "stream_options", "only allowed with stream"),
    ],
)
def test_bad_requests_get_400_in_openai_error_format(server, body, param, words):
    response = complete(server, body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param and words in error["message"], error


def test_bad_json_unknown_model_and_unknown_path(server):
    response = HTTP.post(
        server.url + "/v1/completions", content=b"{not json", headers={"Content-Type": "application/json"}, timeout=10
    )
    assert response.status_code == 400 and "not valid JSON" in response.json()["error"]["message"]
    response = complete(server, {"model": "gpt-4", "prompt": "Hi"})
    assert response.status_code == 404 and response.json()["error"]["code"] == "model_not_found"
    assert HTTP.get(server.url + "/v1/chat").status_code == 404
    assert HTTP.get(server.url + "/v1/completions").status_code == 405


def test_openai_client_sees_the_error(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="top_p"):
        client.completions.create(model="tiny-fp32", prompt="Hi", top_p=2)


# -- packages: a missing one, an int8 one, the prefix cache ----------------------------------------------


def test_serve_refuses_a_missing_package(tmp_path):
    from click.testing import CliRunner
    from edgelm.runtime.cli.main import main

    result = CliRunner().invoke(main, ["serve", "-m", str(tmp_path / "nope")])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    assert "no model package at" in result.stderr and "Traceback" not in result.output


def test_an_int8_package_serves_what_generate_gives(tiny_package_int8):
    """The int8 graph takes inputs_embeds, read by the runtime from model.onnx.data: a request alone in the batch
    gives what Model.generate gives, streamed or not. Rows decoded together share int8's per-pass activation
    scales, so after their first token (each prefilled alone) they may drift from their generate() result."""
    model = load(tiny_package_int8)
    s = InProcessServer(load(tiny_package_int8, spinning=False, prefix_cache_mb=CLI_DEFAULT_MB))  # as serve loads it
    try:
        prompts = PROMPTS[:3]
        for prompt in prompts:
            alone = model.generate(prompt, max_new_tokens=12, do_sample=False).text
            assert (
                complete(s, {"prompt": prompt, "max_tokens": 12, "temperature": 0}).json()["choices"][0]["text"]
                == alone
            )
        body = {"prompt": prompts[1], "max_tokens": 12, "temperature": 0}
        assert streamed_texts(stream_events(s, body))[0] == [
            model.generate(prompts[1], max_new_tokens=12, do_sample=False).text
        ]
        together = complete(s, {"prompt": prompts, "max_tokens": 12, "temperature": 0, "logprobs": 0}).json()
        first = [c["logprobs"]["tokens"][0] for c in sorted(together["choices"], key=lambda c: c["index"])]
        expected = [
            model.generate(p, max_new_tokens=1, do_sample=False, logprobs=0).logprobs[0]["token"] for p in prompts
        ]
        assert first == expected
    finally:
        s.stop()


def test_health_shows_what_the_prefix_cache_holds_and_has_saved(tiny_package, monkeypatch):
    from edgelm.runtime.engine import decode as engine

    monkeypatch.setattr(engine, "PREFILL_CHUNK", 16)  # the tiny model's 64 positions hold prompts of two chunks
    cached = InProcessServer(load(tiny_package, spinning=False, prefix_cache_mb=1))
    plain = InProcessServer(load(tiny_package, spinning=False))
    try:
        assert plain.health()["prefix_cache"] is None
        empty = cached.health()["prefix_cache"]
        assert empty == {"max_bytes": 1 << 20, "bytes": 0, "blocks": 0, "chunk_tokens": 16, "reused_tokens": 0,
                         "pinned_tokens": 0}
        prompt = list(range(100, 140))  # 40 token ids: two whole chunks kept, reused by the same prompt again
        answers = [
            complete(cached, {"prompt": prompt, "max_tokens": 3, "temperature": 0}).json()["choices"][0]["text"]
            for _ in range(2)
        ]
        assert answers[0] == answers[1]
        held = cached.health()["prefix_cache"]
        assert held["blocks"] == 2 and held["reused_tokens"] == 32 and 0 < held["bytes"] <= held["max_bytes"]
    finally:
        cached.stop()
        plain.stop()
