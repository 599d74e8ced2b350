"""A streaming client that vanishes mid-answer: the server notices the lost connection before it writes more
chunks to it, so its log gets no flood of asyncio's "socket.send() raised exception." lines (a client could
otherwise write dozens of lines to the server's log per request)."""

import logging

import httpx
import pytest
from server_harness import InProcessServer


@pytest.fixture
def server(model):
    server = InProcessServer(model)
    yield server
    server.stop()


class Collect(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def test_vanished_stream_clients_do_not_flood_the_log(server):
    collect = Collect()
    logging.getLogger("asyncio").addHandler(collect)
    try:
        before = server.health()["cancelled"]
        body = {"prompt": ["a"] * 8, "n": 4, "max_tokens": 32, "stream": True}
        for _ in range(4):
            with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as response:
                assert response.status_code == 200
                next(response.iter_raw())  # the first chunk, then the client goes away
        health = server.idle("cancelled", before)
    finally:
        logging.getLogger("asyncio").removeHandler(collect)
    assert health["cancelled"] > before and health["active"] == 0, health
    assert not [m for m in collect.messages if "socket.send()" in m], collect.messages[:3]
