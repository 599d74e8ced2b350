"""The server tests whose engine answers a script (server_harness.ScriptedEngine): what they test is the server's
reading and translation of an answer, not the tiny random model's skill."""

import pytest
from server_harness import scripted_model, serve_alone


@pytest.fixture(scope="module")
def model(tiny_package_long):
    """The long-context tiny package, its engine answering what `model.script.say(...)` gives it."""
    return scripted_model(tiny_package_long)


@pytest.fixture(scope="module")
def server(model):
    """The scripted model served alone, up to 400 new tokens a request."""
    s = serve_alone(model, max_tokens=400)
    yield s
    s.stop()
