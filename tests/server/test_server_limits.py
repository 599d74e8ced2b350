"""`edgelm serve`'s limits end to end: the API key, allowed hosts and origins, body size, a full queue, clients that
leave, the request timeout and SIGTERM mid-stream, on the real server in a subprocess or in this process with a
decoder held at a gate.
"""

import json
import signal
import threading
import time

import httpx
import openai
import pytest
from edgelm.runtime import load
from edgelm.runtime.server.api.requests import Limits
from server_harness import HTTP, InProcessServer, Server, complete, gate, stream_events

KEY = "sekret"
# A request that keeps a slot busy for a while on the tiny model: 64 prompts x 8 rows, 50 steps, the top-20
# log-probs and two per-row filters at every step (the SIGTERM test; the others hold a gate instead).
HEAVY = {
    "prompt": ["The quick"] * 64,
    "n": 8,
    "max_tokens": 50,
    "logprobs": 20,
    "ignore_eos": True,
    "temperature": 0,
    "repetition_penalty": 1.1,
    "no_repeat_ngram_size": 2,
}
# A request that stays busy while the gate is held: its echo chunk comes first, before any forward pass.
HELD = {"prompt": "The quick", "max_tokens": 40, "ignore_eos": True, "temperature": 0, "echo": True}


@pytest.fixture(scope="module")
def gated(tiny_package):
    """In this process: one slot, one place in the queue, a 1-second request timeout, and a model whose
    decoder waits at a gate the test holds and releases."""
    model = load(tiny_package)
    engine = gate(model)
    s = InProcessServer(model, Limits(max_tokens=50, request_timeout=1.0), max_batch=1, max_queue=0)
    s.engine = engine
    yield s
    engine.release()
    s.stop()


@pytest.fixture(scope="module")
def strict(tiny_package, tmp_path_factory):
    """An API key, one slot and no queue, small limits, a 2-second request timeout."""
    s = Server(
        tiny_package,
        tmp_path_factory.mktemp("strict"),
        "--api-key",
        KEY,
        "--max-concurrency",
        "1",
        "--max-queue",
        "0",
        "--max-n",
        "8",
        "--max-prompts",
        "64",
        "--max-tokens-limit",
        "50",
        "--max-body-bytes",
        "3000",
        "--request-timeout",
        "2",
        "--allow-host",
        "my.box",
        "--allow-origin",
        "http://app.example",
        "--max-batch-tokens",
        "100",
    )
    yield s
    assert s.stop() == 0, s.log()


def test_api_key(strict):
    assert complete(strict, {"prompt": "Hi", "max_tokens": 2}).status_code == 401
    response = complete(strict, {"prompt": "Hi", "max_tokens": 2}, key="wrong")
    assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_api_key"
    assert complete(strict, {"prompt": "Hi", "max_tokens": 2}, key=KEY).status_code == 200
    client = openai.OpenAI(base_url=strict.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        client.completions.create(model="tiny-fp32", prompt="Hi")
    assert strict.health()["status"] == "ok"  # health needs no key


def test_host_origin_and_token_flags_reach_the_server(strict):
    assert HTTP.get(strict.url + "/health", headers={"Host": f"my.box:{strict.port}"}).status_code == 200
    assert HTTP.get(strict.url + "/health", headers={"Host": "evil.example"}).status_code == 421
    preflight = HTTP.options(
        strict.url + "/v1/completions",
        headers={"Origin": "http://app.example", "Access-Control-Request-Method": "POST"},
    )
    assert preflight.status_code == 200 and preflight.headers["access-control-allow-origin"] == "http://app.example"
    response = complete(strict, {"prompt": ["Hi"] * 2, "n": 2, "max_tokens": 30}, key=KEY)
    assert response.status_code == 400 and "--max-batch-tokens" in response.json()["error"]["message"]


def test_body_too_large_is_413(strict):
    response = complete(strict, {"prompt": "x" * 4000}, key=KEY)
    assert response.status_code == 413 and "--max-body-bytes" in response.json()["error"]["message"]


def test_queue_full_is_429_and_a_client_that_leaves_frees_its_slot(gated):
    before = gated.health()["cancelled"]
    gated.engine.hold()
    with HTTP.stream("POST", gated.url + "/v1/completions", json={**HELD, "stream": True}, timeout=30) as held:
        lines = held.iter_lines()  # kept: dropping a half-read iterator closes the connection
        next(lines)  # the echo chunk: the held request has the only slot
        response = complete(gated, {"prompt": "Hi", "max_tokens": 2})
        assert response.status_code == 429, response.text
        assert response.json()["error"]["code"] == "queue_full"
        assert response.headers["retry-after"] == "1"
    # the client closed its connection after one chunk: its generation stops and the slot comes back
    gated.wait_until_stopped("cancelled")
    gated.engine.release()
    health = gated.idle("cancelled", before)
    assert health["active"] == 0 and health["cancelled"] == before + 1
    assert complete(gated, {"prompt": "Hi", "max_tokens": 2}).status_code == 200


def test_a_client_that_leaves_before_the_answer_stops_its_generation(gated):
    before = gated.health()["cancelled"]
    gated.engine.hold()
    with pytest.raises(httpx.ReadTimeout):
        complete(gated, HELD, timeout=0.5)  # no answer while the gate is held: the client gives up and leaves
    gated.wait_until_stopped("cancelled")
    gated.engine.release()
    health = gated.idle("cancelled", before)
    assert health["active"] == 0 and health["cancelled"] == before + 1


def _past_the_deadline(gated, send):
    """Run `send()` in a thread; once its generation waits at the gate, let its 1-second deadline pass, then
    open the gate: the next step finds the request timed out."""
    result = {}
    gated.engine.hold()
    sender = threading.Thread(target=lambda: result.update(value=send()))
    sender.start()
    assert gated.engine.waiting.wait(30)
    time.sleep(gated.app.limits.request_timeout)  # the request arrived before it waited: now past its deadline
    gated.engine.release()
    sender.join(30)
    return result["value"]


def test_request_timeout(gated):
    gated.idle()
    response = _past_the_deadline(gated, lambda: complete(gated, HELD))
    assert response.status_code == 408 and response.json()["error"]["code"] == "request_timeout"
    gated.idle()
    events = _past_the_deadline(gated, lambda: stream_events(gated, HELD))
    assert events[-1] != "[DONE]" and events[-1]["error"]["code"] == "request_timeout"


def test_sigterm_mid_stream_exits_0_and_never_sends_broken_json(tiny_package, tmp_path):
    s = Server(tiny_package, tmp_path, "--shutdown-timeout", "0.5", "--max-prompts", "64")
    lines = []

    def read():
        try:
            with HTTP.stream("POST", s.url + "/v1/completions", json={**HEAVY, "stream": True}, timeout=30) as response:
                lines.extend(response.iter_lines())
        except httpx.TransportError:  # a closed connection is allowed; a broken event is not
            pass

    reader = threading.Thread(target=read)
    reader.start()
    while not lines and reader.is_alive():
        time.sleep(0.02)
    s.process.send_signal(signal.SIGTERM)
    assert s.process.wait(15) == 0, s.log()
    reader.join(10)
    events = [line[len("data: ") :] for line in lines if line]
    assert events and all(e == "[DONE]" or json.loads(e) for e in events)
    assert events[-1] == "[DONE]" or json.loads(events[-1])["error"]["code"] == "server_shutdown"
    s.stop()
