"""The server with several tokens per pass (`edgelm serve --speculative`): greedy answers token-identical to the
server with speculation off, at one client and at several at once; usage.speculation and the Prometheus
counters where speculation ran, nothing where it did not; the command's options."""

import json
from concurrent.futures import ThreadPoolExecutor

import pytest
from click.testing import CliRunner
from edgelm.runtime import load
from edgelm.runtime.cli.main import main
from edgelm.runtime.server.api.requests import Limits

from server_harness import HTTP, InProcessServer, samples

PROMPTS = [
    "one two three four one two three four one two",
    "the cat sat on the mat. the cat sat on",
    "Hello, my name is",
    "A b c d e f g a b c",
]


@pytest.fixture(scope="module")
def model(tiny_package):
    return load(tiny_package)


@pytest.fixture(scope="module")
def servers(model):
    """A server per --speculative value, the ngram one with --metrics."""
    modes = ("off", "ngram", "auto")
    made = {mode: InProcessServer(model, Limits(speculative=mode), metrics=mode == "ngram") for mode in modes}
    yield made
    for server in made.values():
        server.stop()


def bodies() -> list:
    """(path, body): completions and chat, streamed and not, greedy, one of them with a JSON schema."""
    schema = {"type": "object", "properties": {"n": {"enum": ["alpha", "beta gamma"]}}, "required": ["n"]}
    structured = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    out = []
    for i, prompt in enumerate(PROMPTS):
        out.append(("/v1/completions", {"prompt": prompt, "max_tokens": 20, "temperature": 0, "stream": i % 2 == 1}))
    out.append(("/v1/chat/completions", {"messages": [{"role": "user", "content": PROMPTS[0]}], "max_tokens": 16,
                                         "temperature": 0}))  # fmt: skip
    out.append(("/v1/completions", {"prompt": "JSON:", "max_tokens": 24, "temperature": 0,
                                    "response_format": structured}))  # fmt: skip
    return out


def ask(server, path: str, body: dict) -> tuple:
    """(the answer's texts, its usage) for a streamed or a whole answer."""
    if not body.get("stream"):
        answer = HTTP.post(server.url + path, json=body)
        assert answer.status_code == 200, answer.text
        data = answer.json()
        texts = [c.get("text", c.get("message", {}).get("content")) for c in data["choices"]]
        return texts, data["usage"]
    body = {**body, "stream_options": {"include_usage": True}}
    texts, usage = {}, None
    with HTTP.stream("POST", server.url + path, json=body) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                for choice in chunk["choices"]:
                    texts[choice["index"]] = texts.get(choice["index"], "") + choice.get("text", "")
                usage = chunk.get("usage") or usage
    return [texts[i] for i in sorted(texts)], usage


@pytest.mark.parametrize("mode", ["ngram", "auto"])
def test_one_client_gets_the_answers_of_speculation_off(servers, mode):
    for path, body in bodies():
        plain, plain_usage = ask(servers["off"], path, body)
        fast, usage = ask(servers[mode], path, body)
        assert fast == plain, (path, body)
        assert "speculation" not in plain_usage
        assert usage["completion_tokens"] == plain_usage["completion_tokens"]
        if mode == "ngram" or "response_format" in body:  # alone in the batch: it speculated (auto: forced tokens)
            stats = usage["speculation"]
            assert set(stats) == {"drafted", "accepted", "acceptance_rate"} and stats["accepted"] <= stats["drafted"]
        else:  # auto without a constraint has nothing to propose: no round ran
            assert "speculation" not in usage


def test_several_clients_at_once_get_the_answers_of_speculation_off(servers):
    requests = bodies() * 2
    plain = [ask(servers["off"], path, body)[0] for path, body in requests]
    with ThreadPoolExecutor(8) as pool:
        fast = list(pool.map(lambda request: ask(servers["ngram"], *request)[0], requests))
    assert fast == plain


def test_the_metrics_count_drafted_and_accepted_tokens(servers):
    server = servers["ngram"]
    before = samples(server)
    _, usage = ask(server, "/v1/completions", {"prompt": PROMPTS[0], "max_tokens": 20, "temperature": 0})
    after = samples(server)
    for name in ("drafted", "accepted"):
        metric = f"edgelm_speculative_{name}_tokens_total"
        assert after[metric] - before.get(metric, 0) == usage["speculation"][name]
    assert usage["speculation"]["drafted"] > 0  # a repeating prompt: prompt lookup proposed


def test_the_responses_api_reports_speculation_in_its_usage(servers):
    body = {"input": PROMPTS[0], "max_output_tokens": 12, "temperature": 0}
    answers = {mode: HTTP.post(servers[mode].url + "/v1/responses", json=body).json() for mode in ("off", "ngram")}
    texts = {mode: [part["text"] for item in a["output"] for part in item["content"]] for mode, a in answers.items()}
    assert texts["ngram"] == texts["off"] and texts["off"]
    assert "speculation" in answers["ngram"]["usage"] and "speculation" not in answers["off"]["usage"]


def test_serve_takes_speculative_and_draft_model(tiny_package):
    runner = CliRunner()
    help_text = runner.invoke(main, ["serve", "--help"]).output
    assert "--speculative [auto|ngram|draft|off]" in help_text and "--draft-model" in help_text
    refused = runner.invoke(main, ["serve", "-m", str(tiny_package), "--speculative", "draft"])
    assert refused.exit_code != 0 and "--speculative draft needs --draft-model" in refused.output
    bad = runner.invoke(main, ["serve", "-m", str(tiny_package), "--speculative", "always"])
    assert bad.exit_code != 0 and "'always' is not one of" in bad.output
