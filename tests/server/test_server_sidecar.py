"""`edgelm serve` as an app's sidecar: --port 0 and the ready line on stdout, --parent-pid and --exit-with-stdin
taking it down with its app, a Unix socket (--uds), and GET /metrics in Prometheus' format with --metrics."""

import json
import subprocess
import sys
import time

import httpx
import pytest
from server_harness import HTTP, InProcessServer, samples

SERVE = [sys.executable, "-c", "from edgelm.runtime.cli.main import main; main()", "serve"]


def spawn(package, *options, **popen):
    return subprocess.Popen([*SERVE, "-m", str(package), *options], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, **popen)  # fmt: skip


def ready_line(process) -> dict:
    line = process.stdout.readline()  # the server's first line on stdout, once it can answer
    assert line, f"no ready line; the server said: {process.stderr.read()[-2000:]}"
    return json.loads(line)


def stopped(process, seconds: float = 60) -> int:
    try:
        return process.wait(seconds)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        pytest.fail(f"the server did not stop within {seconds} s")


def test_port_0_picks_a_free_port_and_the_ready_line_names_it(tiny_package):
    server = spawn(tiny_package, "--port", "0", "--model-name", "app")
    try:
        ready = ready_line(server)
        assert ready["event"] == "ready" and ready["model"] == "app" and ready["pid"] == server.pid
        assert ready["port"] > 0 and ready["url"] == f"http://127.0.0.1:{ready['port']}"
        assert HTTP.get(ready["url"] + "/health").json()["status"] == "ok"  # ready means it answers
    finally:
        server.terminate()
        stopped(server)


def test_the_server_stops_when_its_parent_process_ends(tiny_package):
    parent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    server = spawn(tiny_package, "--port", "0", "--parent-pid", str(parent.pid))
    try:
        ready_line(server)
        assert server.poll() is None
        parent.kill()
        parent.wait()
        assert stopped(server) == 0
    finally:
        parent.kill()
        server.kill()


def test_the_server_stops_when_its_standard_input_ends(tiny_package):
    server = spawn(tiny_package, "--port", "0", "--exit-with-stdin", stdin=subprocess.PIPE)
    ready_line(server)
    assert server.poll() is None
    server.stdin.close()
    assert stopped(server) == 0


def test_sigterm_stops_a_server_watching_its_input_cleanly(tiny_package):
    """The thread waiting on standard input must not turn the interpreter's exit into a fatal error."""
    server = spawn(tiny_package, "--port", "0", "--exit-with-stdin", stdin=subprocess.PIPE)
    ready_line(server)
    server.terminate()
    assert stopped(server) == 0
    assert "Fatal Python error" not in server.stderr.read()


def test_a_unix_socket_serves_the_api(tiny_package, tmp_path):
    socket_path = tmp_path / "edgelm.sock"
    server = spawn(tiny_package, "--uds", str(socket_path))
    try:
        assert ready_line(server)["uds"] == str(socket_path)
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(socket_path)), timeout=60) as client:
            assert client.get("http://localhost/health").json()["status"] == "ok"
            done = client.post("http://localhost/v1/completions", json={"prompt": "Hello", "max_tokens": 3})
            assert done.status_code == 200 and done.json()["usage"]["completion_tokens"] == 3
    finally:
        server.terminate()
        stopped(server)


@pytest.fixture(scope="module")
def metered(model):
    server = InProcessServer(model, metrics=True)
    yield server
    server.stop()


def test_metrics_count_requests_tokens_and_latency(metered):
    before = samples(metered)
    body = {"prompt": "Hello", "max_tokens": 4, "temperature": 0}
    assert HTTP.post(metered.url + "/v1/completions", json=body).status_code == 200
    assert HTTP.post(metered.url + "/v1/completions", json=body | {"stream": True}).status_code == 200
    assert HTTP.post(metered.url + "/v1/completions", json={"prompt": 5}).status_code == 400
    HTTP.get(metered.url + "/no/such/path%0d%0aX: y")
    # a request is counted once its handler has returned, which may be after the client has read its last byte
    expected = {
        'edgelm_requests_total{endpoint="/v1/completions",status="200"}': 2,
        'edgelm_requests_total{endpoint="/v1/completions",status="400"}': 1,
        'edgelm_requests_total{endpoint="other",status="404"}': 1,
        "edgelm_generated_tokens_total": 8,
    }
    deadline = time.monotonic() + 10
    while True:
        after = samples(metered)
        delta = lambda name: after.get(name, 0) - before.get(name, 0)  # noqa: E731
        if all(delta(name) >= count for name, count in expected.items()) or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    assert delta('edgelm_requests_total{endpoint="/v1/completions",status="200"}') == 2
    assert delta('edgelm_requests_total{endpoint="/v1/completions",status="400"}') == 1
    assert delta('edgelm_requests_total{endpoint="other",status="404"}') == 1  # the client's path is never a label
    assert delta("edgelm_generated_tokens_total") == 8
    assert delta("edgelm_time_to_first_token_seconds_count") == 2
    assert delta("edgelm_time_per_output_token_seconds_count") == 2
    assert after["edgelm_queue_depth"] == 0 and after["edgelm_running_requests"] == 0
    assert 'edgelm_jobs_ended_total{outcome="finished"}' in after


def test_metrics_are_off_unless_asked_for(model):
    server = InProcessServer(model)
    try:
        assert HTTP.get(server.url + "/metrics").status_code == 404
    finally:
        server.stop()


def test_metrics_need_the_api_key_when_one_is_set(model):
    server = InProcessServer(model, metrics=True, api_key="secret")
    try:
        assert HTTP.get(server.url + "/metrics").status_code == 401
        answer = HTTP.get(server.url + "/metrics", headers={"Authorization": "Bearer secret"})
        assert answer.status_code == 200 and "edgelm_requests_total" in answer.text
    finally:
        server.stop()
