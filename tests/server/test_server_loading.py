"""`edgelm serve` during a cold start: the socket listens before the model has loaded, /health answers 503
{"status": "loading"} and every other request 503 in OpenAI's error shape until it can answer; the ready line
comes only then. A slow load is made by a load() that waits for a file the test writes."""

import json
import select
import subprocess
import sys
import textwrap
import time

import httpx
import pytest

# `edgelm serve` whose model load waits until the file argv[1] exists
SLOW_SERVE = textwrap.dedent("""
    import os, sys, time
    import edgelm.runtime.model as model
    from edgelm.runtime.cli.main import main

    release, load = sys.argv.pop(1), model.load

    def slow_load(*args, **options):
        while not os.path.exists(release):
            time.sleep(0.05)
        return load(*args, **options)

    model.load = slow_load
    sys.argv = ["edgelm", *sys.argv[1:]]
    main()
""")


def spawn(release, *options):
    return subprocess.Popen([sys.executable, "-c", SLOW_SERVE, str(release), "serve", *options],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip


def until_listening(client, process, seconds=60) -> httpx.Response:
    deadline = time.monotonic() + seconds
    while True:
        try:
            return client.get("http://localhost/health")
        except httpx.TransportError:
            assert process.poll() is None, process.stderr.read()[-2000:]
            assert time.monotonic() < deadline, "the server did not listen"
            time.sleep(0.05)


def nothing_on_stdout(process) -> bool:
    return not select.select([process.stdout], [], [], 0)[0]


def stop(process) -> None:
    process.terminate()
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def test_health_says_loading_until_the_model_can_answer(tiny_package, tmp_path):
    socket, release = tmp_path / "edgelm.sock", tmp_path / "release"
    server = spawn(release, "-m", str(tiny_package), "--uds", str(socket))
    client = httpx.Client(transport=httpx.HTTPTransport(uds=str(socket)), timeout=30)
    try:
        health = until_listening(client, server)
        assert health.status_code == 503 and health.json() == {"status": "loading"}
        models = client.get("http://localhost/v1/models")
        assert models.status_code == 503 and models.headers["retry-after"] == "1"
        assert models.json()["error"]["code"] == "model_loading"
        body = {"messages": [{"role": "user", "content": "Hi"}]}
        chat = client.post("http://localhost/v1/chat/completions", json=body)
        assert chat.status_code == 503 and "loading" in chat.json()["error"]["message"]
        assert nothing_on_stdout(server)  # no ready line while it cannot answer
        release.touch()
        ready = json.loads(server.stdout.readline())
        assert ready["event"] == "ready" and ready["uds"] == str(socket)
        health = client.get("http://localhost/health")
        assert health.status_code == 200 and health.json()["status"] == "ok"
        assert client.get("http://localhost/v1/models").status_code == 200
    finally:
        stop(server)
    assert server.returncode == 0


def test_a_load_that_fails_stops_the_server_with_its_one_line(tmp_path):
    release, folder = tmp_path / "release", tmp_path / "not-a-package"
    release.touch()
    folder.mkdir()
    server = spawn(release, "-m", str(folder), "--port", "0")
    try:
        output, errors = server.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        stop(server)
        pytest.fail("the server did not stop after its load failed")
    assert server.returncode == 1 and "Traceback" not in errors
    assert errors.rstrip().splitlines()[-1].startswith(f"Error: {folder} is not a model package"), errors
    assert output == ""  # never ready
