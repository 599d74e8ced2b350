"""OpenAI completions conformance through real HTTP: token-id prompts, echo with the prompt's top_logprobs,
per-chunk log-probs in streams, text_offset, the chosen token in top_logprobs, model names, the tokenizer
endpoints and the default prompt limit. Spoken to with the official openai client (sync and async) and httpx.

Every number is checked against the runtime in this process: Model.score for the prompt's tokens,
Model.generate for the completion's.
"""

import asyncio
import json

import httpx
import openai
import pytest
from click.testing import CliRunner
from edgelm.runtime import load
from edgelm.runtime.cli.serve import serve
from edgelm.runtime.server.api.requests import Limits
from server_harness import HTTP, InProcessServer, Server, complete, stream_events, streamed_texts

KEY = "sekret"
IDS = [40, 69, 76, 76, 79]  # any ids of the tiny vocabulary (320 tokens)


@pytest.fixture(scope="module")
def server(model):
    """In this process: two more names for the model; default limits."""
    s = InProcessServer(model, model_names=("my-gpt", "gpt-3.5-turbo-instruct"))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def keyed(model):
    s = InProcessServer(model, api_key=KEY, accept_any_model=True)
    yield s
    s.stop()


def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def error_of(response) -> dict:
    assert response.status_code == 400, response.text
    return response.json()["error"]


# -- token-id prompts ------------------------------------------------------------------------------------


def test_token_id_prompts_one_and_a_batch_equal_generate(server, model):
    expected = [model.generate([ids], max_new_tokens=6, do_sample=False)[0].text for ids in (IDS, IDS[:2])]
    one = client(server).completions.create(model="my-gpt", prompt=IDS, max_tokens=6, temperature=0)
    assert one.choices[0].text == expected[0] and one.usage.prompt_tokens == len(IDS)
    batch = client(server).completions.create(model="my-gpt", prompt=[IDS, IDS[:2]], max_tokens=6, temperature=0)
    assert [c.text for c in sorted(batch.choices, key=lambda c: c.index)] == expected
    assert batch.usage.prompt_tokens == len(IDS) + 2


@pytest.mark.parametrize(
    "prompt, words",
    [
        (["Hello", [1, 2]], "must be a string or a list of strings, or token ids"),
        ([[1, 2], "Hello"], "must be a string or a list of strings, or token ids"),
        ([1, "2"], "must be a string or a list of strings, or token ids"),
        ([1, True], "must be a string or a list of strings, or token ids"),
        ([1, 320], "prompt[1] is the token id 320, outside the vocabulary (0..319)"),
        ([[1], [2, -1]], "prompt[1][1] is the token id -1, outside the vocabulary"),
        ([10**30], "outside the vocabulary"),
    ],
)
def test_bad_token_id_prompts_name_the_prompt(server, prompt, words):
    error = error_of(complete(server, {"prompt": prompt, "max_tokens": 2}))
    assert error["param"] == "prompt" and words in error["message"], error


# -- echo, logprobs, text_offset -------------------------------------------------------------------------


def test_echo_gives_the_prompt_tokens_top_logprobs(server, model):
    score = model.score("The quick brown fox", top_logprobs=2)
    choice = complete(server, {"prompt": "The quick brown fox", "max_tokens": 0, "echo": True, "logprobs": 2}).json()[
        "choices"
    ][0]
    lp = choice["logprobs"]
    assert lp["tokens"] == score.tokens and lp["token_logprobs"] == pytest.approx(score.logprobs)
    for token, value, top, alternatives in zip(
        lp["tokens"], lp["token_logprobs"], lp["top_logprobs"], score.top_logprobs
    ):
        assert top is not None and len(top) <= 3 and top[token] == value  # the prompt's own token is always there
        assert set(top) >= {a["token"] for a in alternatives[:1]}
        assert max(top.values()) == pytest.approx(alternatives[0]["logprob"])
    assert lp["text_offset"] == [sum(len(t) for t in lp["tokens"][:i]) for i in range(len(lp["tokens"]))]


def test_echo_of_token_ids_scores_them_as_given(server, model):
    """A token-id prompt is scored as sent: its first token has nothing before it, so it alone is null."""
    score = model.score(IDS, top_logprobs=1)
    lp = complete(server, {"prompt": [IDS], "max_tokens": 0, "echo": True, "logprobs": 1}).json()["choices"][0][
        "logprobs"
    ]
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert lp["token_logprobs"][1:] == pytest.approx(score.logprobs[1:])
    assert all(isinstance(top, dict) and 1 <= len(top) <= 2 for top in lp["top_logprobs"][1:])


def test_text_offset_counts_from_the_start_of_the_prompt(server, model):
    prompt = "Hello there"
    body = {"prompt": prompt, "max_tokens": 6, "temperature": 0, "logprobs": 1}
    plain = complete(server, body).json()["choices"][0]
    echoed = complete(server, {**body, "echo": True}).json()["choices"][0]
    lp, both = plain["logprobs"], echoed["logprobs"]
    assert lp["text_offset"][0] == len(prompt)
    assert lp["text_offset"] == [len(prompt) + sum(len(t) for t in lp["tokens"][:i]) for i in range(len(lp["tokens"]))]
    prompt_tokens = len(model.encode(prompt))
    assert both["text_offset"][0] == 0 and both["text_offset"][prompt_tokens:] == lp["text_offset"]
    assert both["tokens"][prompt_tokens:] == lp["tokens"] and echoed["text"] == prompt + plain["text"]


def test_the_sampled_token_is_always_in_top_logprobs(server):
    """Sampling at a high temperature picks tokens outside the top 1; OpenAI then returns logprobs + 1 entries."""
    body = {"prompt": "Once", "max_tokens": 30, "temperature": 3, "seed": 7, "logprobs": 1, "ignore_eos": True}
    lp = complete(server, body).json()["choices"][0]["logprobs"]
    tops = lp["top_logprobs"]
    assert all(token in top for token, top in zip(lp["tokens"], tops))
    assert all(1 <= len(top) <= 2 for top in tops) and any(len(top) == 2 for top in tops)


def test_streamed_chunks_carry_the_logprobs_of_their_own_tokens(server, model):
    body = {"prompt": "Hello", "max_tokens": 12, "temperature": 0, "logprobs": 2, "n": 2, "echo": True}
    whole = complete(server, body).json()["choices"]
    events = stream_events(server, body)
    texts, _ = streamed_texts(events, rows=2)
    assert texts == [c["text"] for c in whole]
    for index in range(2):
        chunks = [c for e in events[:-1] for c in e["choices"] if c["index"] == index]
        assert chunks[0]["text"] == "Hello"  # the echo chunk, with the prompt's log-probs
        assert all(c["logprobs"] is not None for c in chunks)
        assert all(c["logprobs"]["tokens"] for c in chunks if c["text"])  # each text chunk with its tokens
        for field in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
            streamed = [v for c in chunks for v in c["logprobs"][field]]
            assert streamed == whole[index]["logprobs"][field], field
        assert chunks[-1]["finish_reason"] == whole[index]["finish_reason"]


def test_best_of_equal_to_n_is_accepted(server):
    assert complete(server, {"prompt": "Hi", "max_tokens": 2, "n": 2, "best_of": 2}).status_code == 200
    assert error_of(complete(server, {"prompt": "Hi", "max_tokens": 2, "n": 1, "best_of": 2}))["param"] == "best_of"


# -- the official client: sync, async, streamed or not ---------------------------------------------------


def test_openai_client_sync_and_async_streamed_and_not(server, model):
    expected = model.generate("Hello", max_new_tokens=8, do_sample=False)
    options = dict(model="gpt-3.5-turbo-instruct", prompt="Hello", max_tokens=8, temperature=0, logprobs=2, echo=True)
    whole = client(server).completions.create(**options)
    assert whole.choices[0].text == "Hello" + expected.text
    chunks = list(client(server).completions.create(**options, stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert [t for c in chunks if c.choices for t in c.choices[0].logprobs.tokens] == whole.choices[0].logprobs.tokens

    async def both():
        async with openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0) as aclient:
            one = await aclient.completions.create(**{**options, "prompt": [IDS, IDS]})
            stream = await aclient.completions.create(**options, stream=True)
            texts = [c.choices[0].text async for c in stream if c.choices]
            return one, "".join(texts)

    one, streamed = asyncio.run(both())
    assert len(one.choices) == 2 and one.choices[0].text == one.choices[1].text
    assert one.choices[0].logprobs.token_logprobs[0] is None  # a token-id prompt's first token
    assert streamed == whole.choices[0].text


# -- model names -----------------------------------------------------------------------------------------


def test_model_names(server, keyed, model):
    assert [m["id"] for m in HTTP.get(server.url + "/v1/models").json()["data"]] == ["my-gpt"]
    for name in ("my-gpt", "gpt-3.5-turbo-instruct", model.package.name):
        body = complete(server, {"model": name, "prompt": "Hi", "max_tokens": 1}).json()
        assert body["model"] == "my-gpt", body
        assert HTTP.get(f"{server.url}/v1/models/{name}").json()["id"] == "my-gpt"
    refused = complete(server, {"model": "gpt-4", "prompt": "Hi", "max_tokens": 1})
    assert refused.status_code == 404 and refused.json()["error"]["param"] == "model"
    assert "--accept-any-model" in refused.json()["error"]["message"]
    assert HTTP.get(server.url + "/v1/models/gpt-4").status_code == 404
    anything = complete(keyed, {"model": "gpt-4", "prompt": "Hi", "max_tokens": 1}, key=KEY)
    assert anything.status_code == 200 and anything.json()["model"] == model.package.name


def test_a_package_answers_to_the_hub_id_it_was_exported_from(tiny_package, tmp_path):
    """`edgelm export distilgpt2 --quantize int8` makes distilgpt2-int8; the openai example's model="distilgpt2"
    reaches it."""
    import shutil

    folder = shutil.copytree(tiny_package, tmp_path / "distilgpt2-int8")
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["name"], manifest["source"] = "distilgpt2-int8", {"hub_id": "distilgpt2", "revision": "main"}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    s = InProcessServer(load(folder))
    try:
        assert [m["id"] for m in HTTP.get(s.url + "/v1/models").json()["data"]] == ["distilgpt2-int8"]
        for name in ("distilgpt2", "distilgpt2-int8"):
            body = complete(s, {"model": name, "prompt": "Hi", "max_tokens": 1}).json()
            assert body["model"] == "distilgpt2-int8", body
        assert complete(s, {"model": "gpt2", "prompt": "Hi", "max_tokens": 1}).status_code == 404
    finally:
        s.stop()


def test_serve_prints_the_model_id_and_takes_names(tiny_package, tmp_path):
    s = Server(tiny_package, tmp_path, "--model-name", "local-gpt", "--model-name", "other")
    try:
        assert "edgelm serve: model 'local-gpt' (also answers to 'other', 'tiny-fp32')" in s.log()
        openai_client = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0)
        assert openai_client.completions.create(model="other", prompt="Hi", max_tokens=1).model == "local-gpt"
        with pytest.raises(openai.NotFoundError):
            openai_client.completions.create(model="gpt-4", prompt="Hi", max_tokens=1)
    finally:
        assert s.stop() == 0, s.log()
    s = Server(tiny_package, tmp_path, "--accept-any-model")
    try:
        assert "edgelm serve: model 'tiny-fp32' (also answers to any name)" in s.log()
        assert complete(s, {"model": "gpt-4", "prompt": "Hi", "max_tokens": 1}).status_code == 200
    finally:
        assert s.stop() == 0, s.log()


def test_an_empty_model_name_is_refused(tiny_package):
    result = CliRunner().invoke(serve, [str(tiny_package), "--model-name", " "])
    assert result.exit_code == 2 and "model name must not be empty" in result.output


# -- tokenizer endpoints ---------------------------------------------------------------------------------


def test_tokenize_and_detokenize(server, model):
    text = "Hello world, and <|endoftext|> too"
    tokens = HTTP.post(server.url + "/tokenize", json={"content": text}).json()
    assert tokens == {"tokens": model.tokenizer.encode(text).ids}
    special = HTTP.post(server.url + "/tokenize", json={"content": text, "add_special": True}).json()
    assert special == {"tokens": model.tokenizer.encode(text, add_special_tokens=True).ids}
    assert HTTP.post(server.url + "/detokenize", json=tokens).json() == {"content": text}
    assert HTTP.post(server.url + "/detokenize", json={"tokens": []}).json() == {"content": ""}


@pytest.mark.parametrize(
    "path, body, param, words",
    [
        ("/tokenize", {}, "content", "content is required"),
        ("/tokenize", {"content": 5}, "content", "content must be a string"),
        ("/tokenize", {"content": "a", "add_special": "yes"}, "add_special", "true or false"),
        ("/tokenize", {"content": "a", "prompt": "b"}, "prompt", "unknown field"),
        ("/tokenize", {"content": "a\ud800"}, "content", "lone surrogate"),
        ("/detokenize", {"tokens": [1, 320]}, "tokens", "tokens[1] is the token id 320, outside the vocabulary"),
        ("/detokenize", {"tokens": [-1]}, "tokens", "outside the vocabulary"),
        ("/detokenize", {"tokens": ["a"]}, "tokens", "tokens must be a list of token ids"),
        ("/detokenize", {"tokens": 5}, "tokens", "tokens must be a list of token ids"),
        ("/detokenize", {}, "tokens", "tokens is required"),
    ],
)
def test_tokenizer_endpoints_refuse_bad_bodies(server, path, body, param, words):
    # json.dumps escapes a lone surrogate as JSON may (\ud800); httpx's own encoder cannot
    response = HTTP.post(server.url + path, content=json.dumps(body), headers={"Content-Type": "application/json"})
    error = error_of(response)
    assert error["param"] == param and words in error["message"], error


def test_tokenizer_endpoints_take_json_only_known_hosts_and_the_key(keyed):
    for path, body in (("/tokenize", {"content": "Hi"}), ("/detokenize", {"tokens": [1]})):
        assert HTTP.post(keyed.url + path, json=body).status_code == 401
        auth = {"Authorization": f"Bearer {KEY}"}
        assert HTTP.post(keyed.url + path, json=body, headers=auth).status_code == 200
        form = HTTP.post(keyed.url + path, content=b"content=Hi", headers={**auth, "Content-Type": "text/plain"})
        assert form.status_code == 415
        rebound = HTTP.post(keyed.url + path, json=body, headers={**auth, "Host": "evil.example"})
        assert rebound.status_code == 421
        assert HTTP.get(keyed.url + path, headers=auth).status_code == 405
    assert HTTP.get(keyed.url + "/health").status_code == 200  # still open without the key


# -- limits ----------------------------------------------------------------------------------------------


def test_a_langchain_batch_of_20_prompts_fits_the_default_limits(server, model):
    prompts = [f"Item {i}:" for i in range(20)]
    answer = client(server).completions.create(model="my-gpt", prompt=prompts, max_tokens=4, temperature=0)
    assert len(answer.choices) == 20
    assert Limits().max_prompts >= 20


def test_max_prompts_and_max_batch_tokens_still_bound_a_request(model):
    s = InProcessServer(model, Limits(max_prompts=3, max_batch_tokens=40))
    try:
        error = error_of(complete(s, {"prompt": ["a"] * 4, "max_tokens": 1}))
        assert error["param"] == "prompt" and "--max-prompts" in error["message"]
        error = error_of(complete(s, {"prompt": [IDS] * 3, "max_tokens": 10}))
        assert "--max-batch-tokens" in error["message"]
    finally:
        s.stop()


def test_httpx_sees_an_echo_only_request_of_token_ids(server):
    response = httpx.post(
        server.url + "/v1/completions", json={"prompt": [IDS], "max_tokens": 0, "echo": True}, timeout=30
    )
    choice = response.json()["choices"][0]
    assert choice["finish_reason"] == "length" and choice["logprobs"] is None and choice["text"]
