"""A request whose tool-call reader fails ends alone: the requests decoding beside it in the running batch get what
they get without it, and none of them sees its error."""

import threading

from server_harness import HTTP

CALL = '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>'
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
SECRET = "the reader of the request with tools failed"


def test_a_failing_tool_call_reader_ends_its_own_request_only(server, model, monkeypatch):
    from edgelm.runtime.text import tool_stream

    model.script.say("Sunny all day. " + CALL)
    plain = {"messages": [{"role": "user", "content": "Time?"}], "temperature": 0, "max_tokens": 300}
    alone = HTTP.post(server.url + "/v1/chat/completions", json=plain).json()["choices"][0]["message"]["content"]

    def failing(self, text):
        raise RuntimeError(SECRET)

    for reader in (tool_stream.ToolStream, tool_stream.TaggedStream, tool_stream.JsonAnswerStream):
        monkeypatch.setattr(reader, "feed", failing)
    bodies = [{**plain, "tools": [TIME]}, plain, {**plain, "stream": True}, plain]
    answers = [None] * len(bodies)

    def send(k):
        answers[k] = HTTP.post(server.url + "/v1/chat/completions", json=bodies[k], timeout=60)

    clients = [threading.Thread(target=send, args=(k,)) for k in range(len(bodies))]
    for client in clients:
        client.start()
    for client in clients:
        client.join(60)
    failed = answers[0]
    assert failed.status_code == 500 and failed.headers["content-type"] == "application/json", failed.text
    assert "Traceback" not in failed.text
    for k in (1, 3):
        assert answers[k].status_code == 200 and answers[k].json()["choices"][0]["message"]["content"] == alone
    assert answers[2].status_code == 200 and SECRET not in answers[2].text and "[DONE]" in answers[2].text
    assert all(SECRET not in answer.text for answer in answers[1:])
    assert HTTP.get(server.url + "/health").status_code == 200  # the server goes on
