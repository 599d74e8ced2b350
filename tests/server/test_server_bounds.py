"""What one request may make the server do: a chat template that runs long stops at --request-timeout (408)
and leaves the other endpoints answering; stop lists are bounded in count and length (the API, the CLI and
the server share the check); /tokenize and /detokenize answer from their own worker, equal to the model's
own tokenizer."""

import concurrent.futures
import json

import pytest
from click.testing import CliRunner
from edgelm.runtime.cli.main import main
from edgelm.runtime.errors import GenerationOptionError
from edgelm.runtime.generation_config import MAX_STOP_CHARS, MAX_STOP_STRINGS
from edgelm.runtime.server.api.requests import Limits
from edgelm.runtime.text.chat_template import ChatTemplate
from server_harness import HTTP, InProcessServer

SLOW = "{% for i in range(100000) %}{% for j in range(19) %}{% endfor %}{% endfor %}{{ messages[0].content }}"
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def server(model):
    s = InProcessServer(model, Limits(max_tokens=8, request_timeout=1.0), max_batch=1)
    yield s
    s.stop()


def test_a_slow_chat_template_gets_408_at_the_deadline_and_others_are_served(server, model, monkeypatch):
    monkeypatch.setattr(model, "chat_template", ChatTemplate(SLOW))
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        chats = [
            pool.submit(HTTP.post, server.url + "/v1/chat/completions", json={"messages": HI, "max_tokens": 2})
            for _ in range(6)
        ]
        tokenized = pool.submit(HTTP.post, server.url + "/tokenize", json={"content": "hello"})
        answers = [c.result() for c in chats]
    assert [a.status_code for a in answers] == [408] * 6, answers[0].text
    assert answers[0].json()["error"]["code"] == "request_timeout"
    assert tokenized.result().json() == {"tokens": model.encode("hello")}


@pytest.mark.parametrize(
    "stop, fragment",
    [
        (["ab"] * 90_000, "at most"),
        (["x"] * (MAX_STOP_STRINGS + 1), "at most"),
        (["y" * (MAX_STOP_CHARS + 1)], "characters"),
    ],
    ids=["90000-strings", "one-too-many", "too-long"],
)
def test_stop_lists_are_bounded_everywhere(stop, fragment, server, model):
    with pytest.raises(GenerationOptionError, match=fragment) as raised:
        model.settings(stop=stop)
    assert raised.value.param == "stop"
    response = HTTP.post(server.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2, "stop": stop})
    assert response.status_code == 400 and response.json()["error"]["param"] == "stop", response.text
    if len(stop) < 100:
        args = [a for s in stop for a in ("--stop", s)]
        result = CliRunner().invoke(main, ["generate", "-m", str(model.package.folder), "hi", *args])
        assert result.exit_code != 0 and fragment in result.output and "Traceback" not in result.output


def test_the_allowed_stop_lists_still_work(model):
    assert len(model.settings(stop=["x"] * MAX_STOP_STRINGS).stop) == MAX_STOP_STRINGS
    answer = model.chat(HI, max_new_tokens=3, stop=["a", "b", "c", "d"])  # OpenAI's 4, and the template's own
    assert isinstance(answer.text, str)


def test_tokenize_and_detokenize_of_a_large_body_equal_the_tokenizer(server, model):
    text = "Hello world, " * 60_000  # ~780 kB, under --max-body-bytes
    tokens = HTTP.post(server.url + "/tokenize", json={"content": text}, timeout=120)
    assert tokens.status_code == 200 and tokens.json()["tokens"] == model.tokenizer.encode(text).ids
    back = HTTP.post(server.url + "/detokenize", json={"tokens": tokens.json()["tokens"][:5000]}, timeout=120)
    assert back.json()["content"] == model.tokenizer.decode(tokens.json()["tokens"][:5000], skip_special_tokens=False)
    assert json.loads(HTTP.get(server.url + "/health").text)["status"] == "ok"


def test_serve_shows_the_limits_defaults_the_server_applies():
    """Each limit's default is the one Limits holds: `edgelm serve` restates none of them."""
    import dataclasses

    from edgelm.runtime.cli.serve import serve

    defaults = {p.name: p.default for p in serve.params}
    limits = {f.name: f.default for f in dataclasses.fields(Limits) if f.name != "max_tokens"}
    assert limits and all(defaults[name] == value for name, value in limits.items())
