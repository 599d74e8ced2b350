"""`edgelm serve` stops on SIGTERM within a bound, exit status 0 (docs/serve.md), even while chat requests are
rendering a package's slow-but-bounded chat template: renders that cannot be interrupted still end at their
work budget or deadline, so none holds the process past it, and every client gets an answer rather than a
hang: its reply, or, for a request still rendering --shutdown-timeout into the shutdown, a JSON 503; the log
shows no traceback."""

import hashlib
import json
import shutil
import signal
import threading
import time

import httpx
from server_harness import HTTP, Server

# Some 300,000 loop passes: within the render budget (chat_bounds.MAX_RENDER_STEPS), so each render completes,
# taking a second or more; the renders share the GIL, so several in flight take several times that.
SLOW = "{% for i in range(100000) %}{% for j in range(3) %}{% endfor %}{% endfor %}{{ messages[0].content }}"
CHATS = 4
EXIT_BOUND_S = 30  # well past --shutdown-timeout and one render; a hang would be unbounded


def slow_template_package(tiny_package, tmp_path):
    folder = shutil.copytree(tiny_package, tmp_path / "slow-template")
    config = folder / "tokenizer_config.json"
    config.write_text(json.dumps({"chat_template": SLOW}))
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["files"][config.name] = {
        "size": config.stat().st_size,
        "sha256": hashlib.sha256(config.read_bytes()).hexdigest(),
    }
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def test_sigterm_with_slow_chat_templates_in_flight_exits_0_within_a_bound(tiny_package, tmp_path):
    s = Server(slow_template_package(tiny_package, tmp_path), tmp_path, "--shutdown-timeout", "0.5")
    answers = []

    def chat():
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        try:
            response = HTTP.post(s.url + "/v1/chat/completions", json=body, timeout=60)
            answers.append((response.status_code, response.headers.get("content-type"), time.monotonic()))
        except httpx.TransportError as error:  # the server closed the connection without an answer
            answers.append((repr(error), None, time.monotonic()))

    clients = [threading.Thread(target=chat) for _ in range(CHATS)]
    for client in clients:
        client.start()
    time.sleep(0.5)  # the requests reach the server; one is checked below to have been in flight at the signal
    started = time.monotonic()
    s.process.send_signal(signal.SIGTERM)
    assert s.process.wait(EXIT_BOUND_S) == 0, s.log()
    for client in clients:
        client.join(10)
    assert len(answers) == CHATS and not any(c.is_alive() for c in clients), answers
    assert any(at > started for _, _, at in answers), answers  # not all answered before SIGTERM: some were in flight
    assert all(status in (200, 503) and kind == "application/json" for status, kind, _ in answers), answers
    assert any(status == 503 for status, _, _ in answers), answers  # a render still running past the timeout
    log = s.log()
    assert "Traceback" not in log and "CancelledError" not in log, log
    s.stop()
