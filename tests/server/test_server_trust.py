"""What `edgelm serve` accepts from the outside: web pages, host names, slow and hostile clients, odd text,
keys, and what a request that ends early leaves behind. All in this process (create_app under uvicorn in a
thread), the model's decoder held at a gate where a request must stay busy."""

import gc
import json
import logging
import time

import httpx
import pytest
from edgelm.runtime import load
from edgelm.runtime.errors import GenerationOptionError
from edgelm.runtime.server.api.requests import Limits
from server_harness import HTTP, InProcessServer, RawConnection, complete, gate, stream_events

KEY = "clé-ключ-🔑"
HELD = {"prompt": "The quick", "max_tokens": 40, "ignore_eos": True, "temperature": 0, "echo": True}


@pytest.fixture(scope="module")
def model(tiny_package):
    model = load(tiny_package)
    model.gated = gate(model)
    return model


@pytest.fixture(scope="module")
def server(model):
    """Default settings, but a half-second read timeout and a small bound on the tokens one request holds."""
    s = InProcessServer(model, Limits(max_tokens=50, read_timeout=0.5, max_batch_tokens=400), max_batch=1)
    yield s
    model.gated.release()
    s.stop()


@pytest.fixture(scope="module")
def open_server(model):
    """--allow-host my.box --allow-origin http://app.example and an API key that is not ASCII."""
    s = InProcessServer(model, allow_hosts=("my.box",), allow_origins=("http://app.example",), api_key=KEY)
    yield s
    s.stop()


def post(server, body: bytes, **headers) -> httpx.Response:
    return HTTP.post(server.url + "/v1/completions", content=body, headers=headers)


# -- a web page cannot drive it --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "content_type", [None, "text/plain", "application/x-www-form-urlencoded", "multipart/form-data"]
)
def test_only_json_bodies_are_taken(server, content_type):
    headers = {"Content-Type": content_type} if content_type else {}
    response = post(server, b'{"prompt": "Hi", "max_tokens": 2}', **headers)
    assert response.status_code == 415, response.text
    assert response.json()["error"]["code"] == "unsupported_media_type"


def test_json_with_a_utf8_charset_is_fine(server):
    response = post(server, b'{"prompt": "Hi", "max_tokens": 2}', **{"Content-Type": "application/json; charset=utf-8"})
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("host", ["evil.example", "evil.example:{port}", "127.0.0.1:1", "localhost.evil.example"])
def test_an_unknown_host_name_is_refused(server, host):
    response = HTTP.get(server.url + "/v1/models", headers={"Host": host.format(port=server.port)})
    assert response.status_code == 421
    assert response.json()["error"]["code"] == "invalid_host"


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.1:{port}", "localhost", "LOCALHOST:{port}", "[::1]:{port}"])
def test_the_servers_own_names_are_accepted(server, host):
    assert HTTP.get(server.url + "/v1/models", headers={"Host": host.format(port=server.port)}).status_code == 200


def test_allow_host_adds_a_name(open_server):
    assert HTTP.get(open_server.url + "/health", headers={"Host": f"my.box:{open_server.port}"}).status_code == 200
    assert HTTP.get(open_server.url + "/health", headers={"Host": "other.box"}).status_code == 421


def test_no_cors_by_default(server):
    preflight = HTTP.options(
        server.url + "/v1/completions",
        headers={"Origin": "http://evil.example", "Access-Control-Request-Method": "POST"},
    )
    assert preflight.status_code != 200 and "access-control-allow-origin" not in preflight.headers
    response = complete(server, {"prompt": "Hi", "max_tokens": 1}, headers={"Origin": "http://evil.example"})
    assert response.status_code == 200 and "access-control-allow-origin" not in response.headers


def test_allow_origin_turns_cors_on_for_that_origin(open_server):
    ask = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization, content-type"}
    preflight = HTTP.options(open_server.url + "/v1/completions", headers={"Origin": "http://app.example", **ask})
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == "http://app.example"
    assert "authorization" in preflight.headers["access-control-allow-headers"].lower()
    other = HTTP.options(open_server.url + "/v1/completions", headers={"Origin": "http://evil.example", **ask})
    assert "access-control-allow-origin" not in other.headers
    answer = complete(
        open_server, {"prompt": "Hi", "max_tokens": 1}, key=None, headers={"Origin": "http://app.example"}
    )
    assert answer.status_code == 401 and answer.headers["access-control-allow-origin"] == "http://app.example"


def test_allow_origin_star(model):
    s = InProcessServer(model, allow_origins=("*",))
    try:
        preflight = HTTP.options(
            s.url + "/v1/completions",
            headers={"Origin": "http://any.example", "Access-Control-Request-Method": "POST"},
        )
        assert preflight.status_code == 200 and preflight.headers["access-control-allow-origin"] == "*"
    finally:
        s.stop()


# -- keys ------------------------------------------------------------------------------------------------


def test_a_non_ascii_api_key_sent_as_utf8_is_accepted(open_server):
    body = {"prompt": "Hi", "max_tokens": 1}
    url = open_server.url + "/v1/completions"
    right = HTTP.post(url, json=body, headers={"Authorization": b"Bearer " + KEY.encode("utf-8")})
    assert right.status_code == 200, right.text
    wrong = HTTP.post(url, json=body, headers={"Authorization": b"Bearer " + "clé-ключ".encode("utf-8")})
    assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_api_key"
    latin1 = HTTP.post(url, json=body, headers={"Authorization": b"Bearer " + KEY.encode("utf-8")[:6]})
    assert latin1.status_code == 401


# -- slow clients ----------------------------------------------------------------------------------------


def test_a_connection_that_sends_nothing_is_closed(server):
    connection = RawConnection(server.port, timeout=30)
    try:
        assert connection.closed_by_server()
    finally:
        connection.close()


def test_headers_sent_slowly_are_cut_off(server):
    connection = RawConnection(server.port, timeout=30)
    try:
        connection.sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        closed = False
        for _ in range(100):  # a header byte every 0.1 s, never the blank line that ends the head
            try:
                connection.sock.sendall(b"X")
            except OSError:
                closed = True
                break
            time.sleep(0.1)
        assert closed or connection.closed_by_server()
    finally:
        connection.close()


def test_a_body_sent_slowly_gets_408_and_the_connection_is_closed(server):
    connection = RawConnection(server.port, timeout=30)
    try:
        connection.sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100\r\n\r\n{\"prompt\": "
        )
        status, headers, body = connection.response()
        assert status == 408 and json.loads(body)["error"]["code"] == "request_timeout"
        assert "--read-timeout" in json.loads(body)["error"]["message"]
        assert headers.get("connection") == "close" and connection.closed_by_server()
    finally:
        connection.close()


def test_a_keep_alive_connection_gets_the_same_time_for_its_next_head(server):
    connection = RawConnection(server.port, timeout=30)
    try:
        assert connection.post("/v1/completions", b'{"prompt": "Hi", "max_tokens": 1}')[0] == 200
        connection.sock.sendall(b"GET /health HTTP/1.1\r\nHo")  # and never the rest
        assert connection.closed_by_server()
    finally:
        connection.close()


# -- inputs that used to be 500s -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path, body, param",
    [
        ("/v1/completions", {"prompt": "a\ud800b"}, "prompt"),
        ("/v1/completions", {"prompt": ["ok", "a\udfffb"]}, "prompt"),
        ("/v1/completions", {"prompt": "a\ud800b", "echo": True, "max_tokens": 0, "logprobs": 0}, "prompt"),
        ("/v1/completions", {"prompt": "Hi", "stop": "\ud800"}, "stop"),
        ("/v1/completions", {"prompt": "Hi", "model": "\ud800"}, "model"),
        ("/v1/completions", {"prompt": "Hi", "logit_bias": {"\ud800": 1}}, "logit_bias"),
        ("/v1/completions", {"prompt": "Hi", "\ud800": 1}, None),
        ("/v1/score", {"text": "a\ud800b"}, "text"),
    ],
)
def test_a_lone_surrogate_is_a_400_naming_the_field_on_a_connection_that_stays_open(server, path, body, param):
    connection = RawConnection(server.port)
    try:
        status, _, answer = connection.post(path, json.dumps(body).encode("ascii"))  # "\ud800" as JSON escapes it
        assert status == 400, answer
        assert json.loads(answer)["error"]["param"] == param
        assert connection.post("/v1/completions", b'{"prompt": "Hi", "max_tokens": 1}')[0] == 200
    finally:
        connection.close()


@pytest.mark.parametrize(
    "body", [b"[" * 100_000 + b"]" * 100_000, b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"]
)
def test_json_nested_100000_deep_is_a_400_on_a_connection_that_stays_open(server, body):
    connection = RawConnection(server.port)
    try:
        status, _, answer = connection.post("/v1/completions", body)
        assert status == 400 and json.loads(answer)["error"]["code"] == "invalid_json"
        assert connection.post("/v1/completions", b'{"prompt": "Hi", "max_tokens": 1}')[0] == 200
    finally:
        connection.close()


def test_a_nested_value_within_the_parser_depth_is_a_type_error(server):
    response = post(server, b'{"prompt": ' + b"[" * 500 + b"]" * 500 + b"}", **{"Content-Type": "application/json"})
    assert response.status_code == 400 and response.json()["error"]["param"] == "prompt"


@pytest.mark.parametrize("options", [{"temperature": 1e-42}, {"temperature": 0.5, "repetition_penalty": 1e-300}])
def test_options_that_make_logits_non_finite_get_an_answer_or_a_400(server, options):
    connection = RawConnection(server.port)
    try:
        body = json.dumps({"prompt": "Hi", "max_tokens": 4, "seed": 1, **options}).encode()
        status, _, answer = connection.post("/v1/completions", body)
        assert status in (200, 400), answer
        if status == 400:
            assert json.loads(answer)["error"]["param"] in options
        assert connection.post("/v1/completions", b'{"prompt": "Hi", "max_tokens": 1}')[0] == 200
    finally:
        connection.close()


def test_a_library_error_during_generation_is_a_400_with_its_param(server, model):
    model.gated.fail = GenerationOptionError("top_k went wrong; lower it", param="top_k")
    try:
        response = complete(server, {"prompt": "Hi", "max_tokens": 3, "top_k": 3})
        assert response.status_code == 400 and response.json()["error"]["param"] == "top_k"
        events = stream_events(server, {"prompt": "Hi", "max_tokens": 3, "top_k": 3})
        assert events[-1]["error"]["param"] == "top_k"
        model.gated.fail = GenerationOptionError("no_new_tokens", param="max_new_tokens")
        assert complete(server, {"prompt": "Hi", "max_tokens": 3}).json()["error"]["param"] == "max_tokens"
    finally:
        model.gated.fail = None
    assert complete(server, {"prompt": "Hi", "max_tokens": 1}).status_code == 200


def test_an_unexpected_error_is_a_500_on_a_connection_that_stays_open(server, model):
    model.gated.fail = IndexError("index 7 is out of bounds")
    connection = RawConnection(server.port)
    try:
        status, _, answer = connection.post("/v1/completions", b'{"prompt": "Hi", "max_tokens": 2}')
        assert status == 500 and json.loads(answer)["error"]["type"] == "server_error"
        model.gated.fail = None
        assert connection.post("/v1/completions", b'{"prompt": "Hi", "max_tokens": 1}')[0] == 200
    finally:
        model.gated.fail = None
        connection.close()


# -- limits ----------------------------------------------------------------------------------------------


def test_tokens_one_request_may_hold_are_bounded(server, model):
    response = complete(server, {"prompt": ["Hi"] * 4, "n": 8, "max_tokens": 20})  # 4 x 8 x (1 + 20) > 400
    assert response.status_code == 400 and response.json()["error"]["code"] == "request_too_large"
    assert "--max-batch-tokens" in response.json()["error"]["message"]
    long = "The quick brown fox"  # few rows, but long prompts: counted after tokenizing, 2 x 8 x (20+ + 10) > 400
    while len(model.encode(long)) <= 20:
        long += " jumps"
    assert len(model.encode(long)) + 10 <= model.arch.n_positions
    response = complete(server, {"prompt": [long] * 2, "n": 8, "max_tokens": 10})
    assert response.status_code == 400 and response.json()["error"]["code"] == "request_too_large"
    assert complete(server, {"prompt": ["Hi"] * 2, "n": 2, "max_tokens": 20}).status_code == 200


def test_usage_is_null_in_stream_chunks_without_it(server):
    events = stream_events(server, {"prompt": "Hi", "max_tokens": 3, "stream_options": {"include_usage": True}})
    chunks = events[:-1]
    assert all("usage" in c for c in chunks)
    assert all(c["usage"] is None for c in chunks[:-1]) and chunks[-1]["usage"]["completion_tokens"] >= 1


# -- the log ---------------------------------------------------------------------------------------------


def test_what_the_client_sends_cannot_forge_log_lines(server, caplog):
    with caplog.at_level(logging.INFO, logger="edgelm.server"):
        HTTP.get(server.url + "/v1/x%0d%0a2026-01-01 INFO edgelm.server: forged%1b[2J")
        deadline = time.monotonic() + 10
        while not any("forged" in r.getMessage() for r in caplog.records) and time.monotonic() < deadline:
            time.sleep(0.02)
    lines = [r.getMessage() for r in caplog.records if "forged" in r.getMessage()]
    assert lines and all("\r" not in line and "\n" not in line and "\x1b" not in line for line in lines)
    assert "\\r\\n2026-01-01" in lines[0]


# -- a request that ends early leaves nothing behind ------------------------------------------------------


def _collected_without_gc(model, server, end_request) -> None:
    """`end_request()` ends a request early; then its Batch and decoder must be freed by reference counting alone."""
    before = len(model.batches)
    gc.collect()
    gc.disable()
    try:
        end_request()
        deadline = time.monotonic() + 10
        while True:
            batches = [ref() for ref in model.batches[before:]]
            decoders = [ref() for ref in model.gated.decoders[-len(batches) :]] if batches else []
            alive = sum(x is not None for x in batches + decoders)
            del batches, decoders
            if not alive or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert len(model.batches) > before and alive == 0, f"{alive} of the request's objects are still alive"
    finally:
        gc.enable()


def test_a_cancelled_stream_frees_its_batch_without_a_garbage_collection(server, model):
    def cancel():
        before = server.health()["cancelled"]
        model.gated.hold()
        with HTTP.stream("POST", server.url + "/v1/completions", json={**HELD, "stream": True}) as held:
            next(held.iter_lines())  # the echo chunk; then the client goes away
        server.wait_until_stopped("cancelled")
        model.gated.release()
        assert server.idle("cancelled", before)["cancelled"] == before + 1

    _collected_without_gc(model, server, cancel)


def test_a_client_that_leaves_frees_its_batch_without_a_garbage_collection(server, model):
    def leave():
        before = server.health()["cancelled"]
        model.gated.hold()
        with pytest.raises(httpx.ReadTimeout):
            complete(server, HELD, timeout=0.5)
        server.wait_until_stopped("cancelled")
        model.gated.release()
        assert server.idle("cancelled", before)["cancelled"] == before + 1

    _collected_without_gc(model, server, leave)


def test_a_failed_request_frees_its_batch_without_a_garbage_collection(server, model):
    def fail():
        model.gated.fail = GenerationOptionError("broken", param="top_k")
        try:
            assert complete(server, {"prompt": "Hi", "max_tokens": 3}).status_code == 400
        finally:
            model.gated.fail = None

    _collected_without_gc(model, server, fail)
