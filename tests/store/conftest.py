"""The store's tests: a hub-shaped server on 127.0.0.1 that `edgelm pull` talks to (HF_ENDPOINT)."""

import pytest
from fake_hub import FakeHub


@pytest.fixture
def hub(monkeypatch):
    server = FakeHub()
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    yield server
    server.stop()
