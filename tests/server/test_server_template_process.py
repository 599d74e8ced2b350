"""A large conversation's chat template renders in a process of the server's own (template_process.py), so that
its Python never holds the serving process's GIL: the prompt, the answer and the errors (with their param) are
those of a render in the server's threads; the process is bounded by the request's deadline, replaced when it
dies, and ended with the server. Whether a render ran here is seen by making this process's render fail."""

import json
import time

import pytest
from edgelm.runtime import load
from edgelm.runtime.errors import DeadlineError
from edgelm.runtime.server.api import chat as chat_api
from edgelm.runtime.server.api.requests import Limits
from edgelm.runtime.server.api_errors import ApiError
from edgelm.runtime.server.template_process import RENDER_ELSEWHERE_FROM, TemplateProcess
from edgelm.runtime.text.chat_template import ChatTemplate
from server_harness import HTTP, InProcessServer

CHAT = {"messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 3, "temperature": 0}


@pytest.fixture
def server(tiny_package):
    s = InProcessServer(load(tiny_package), Limits(max_tokens=8))
    yield s
    s.stop()


def chat(server, body) -> "httpx.Response":  # noqa: F821
    return HTTP.post(server.url + "/v1/chat/completions", json=body)


def no_render_here(monkeypatch) -> None:
    """A conversation rendered in this process fails with a 500; one rendered in the template process does not."""

    def refuse(self, messages, *args, **options):
        raise RuntimeError("rendered in the serving process")

    monkeypatch.setattr(ChatTemplate, "render", refuse)


def test_a_conversation_from_the_threshold_on_renders_in_the_process_with_the_same_answer(server, monkeypatch):
    here = chat(server, CHAT)
    assert here.status_code == 200, here.text
    monkeypatch.setattr(chat_api, "RENDER_ELSEWHERE_FROM", 0)  # every body is large enough
    no_render_here(monkeypatch)
    elsewhere = chat(server, CHAT)
    assert elsewhere.status_code == 200, elsewhere.text
    assert elsewhere.json()["choices"] == here.json()["choices"]
    assert elsewhere.json()["usage"] == here.json()["usage"]
    assert server.app.templates._process.poll() is None  # started, and kept for the next


def test_a_body_below_the_threshold_renders_in_the_servers_threads(server, monkeypatch):
    no_render_here(monkeypatch)
    response = chat(server, CHAT)
    assert response.status_code == 500 and "rendered in the serving process" in response.text
    assert server.app.templates._process is None  # never started


def test_a_body_near_max_body_bytes_renders_elsewhere_and_is_refused_for_its_length(server, monkeypatch):
    no_render_here(monkeypatch)
    message = {"role": "user", "content": "x" * 180}
    body = {"messages": [message] * (RENDER_ELSEWHERE_FROM // 150), "max_tokens": 1}
    assert len(json.dumps(body)) >= RENDER_ELSEWHERE_FROM
    response = chat(server, body)
    assert response.status_code == 400, response.text  # the prompt is far longer than the tiny model's context
    assert "rendered in the serving process" not in response.text


def test_an_error_of_the_render_names_the_clients_field(server):
    messages = [{"role": "user", "content": "x" * 180}] * (RENDER_ELSEWHERE_FROM // 150)
    messages = [*messages, {"role": "narrator", "content": "Once"}]
    response = chat(server, {"messages": messages, "max_tokens": 1})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == f"messages[{len(messages) - 1}].role" and "narrator" in error["message"]


def test_a_render_past_its_deadline_is_a_deadline_error(model):
    templates = TemplateProcess(model.chat_template)
    try:
        with pytest.raises(DeadlineError):
            templates.render(CHAT["messages"], None, time.monotonic() - 1)
        assert templates.render(CHAT["messages"], None, time.monotonic() + 60) == model.chat_template.render(
            CHAT["messages"]
        )
    finally:
        templates.close()


def test_a_process_that_died_is_replaced_and_close_ends_it(model):
    templates = TemplateProcess(model.chat_template)
    expected = model.chat_template.render(CHAT["messages"])
    try:
        assert templates.render(CHAT["messages"], None, time.monotonic() + 60) == expected
        first = templates._process
        first.kill()
        first.wait()
        assert templates.render(CHAT["messages"], None, time.monotonic() + 60) == expected
        assert templates._process is not first
    finally:
        templates.close()
    with pytest.raises(ApiError) as closed:
        templates.render(CHAT["messages"], None, time.monotonic() + 60)
    assert closed.value.status == 503 and templates._process is None


def test_the_servers_shutdown_ends_the_process(tiny_package, monkeypatch):
    monkeypatch.setattr(chat_api, "RENDER_ELSEWHERE_FROM", 0)
    server = InProcessServer(load(tiny_package), Limits(max_tokens=8))
    try:
        assert chat(server, CHAT).status_code == 200
        process = server.app.templates._process
        assert process.poll() is None
    finally:
        server.stop()
    assert process.wait(10) is not None
