"""The Responses API's answer: a `response` object, and the server-sent events the openai client's
`responses.create(stream=True)` reads.

    response     {id, object: "response", created_at, status: "completed" | "incomplete", model, output: [items],
                  usage: {input_tokens, output_tokens, total_tokens, ...}, incomplete_details, and the request's
                  instructions, tools, tool_choice, text, temperature, top_p, ... echoed; store: false}
    output items {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text", ...}]}
                 {"type": "function_call", "call_id", "name", "arguments"} per call the answer makes
    events       response.created, response.in_progress; per message: response.output_item.added,
                 response.content_part.added, response.output_text.delta..., response.output_text.done,
                 response.content_part.done, response.output_item.done; per call: response.output_item.added,
                 response.function_call_arguments.delta, response.function_call_arguments.done,
                 response.output_item.done; then response.completed (or response.incomplete, cut by
                 max_output_tokens). A stream that fails ends with an `error` event. Each has a sequence_number.
"""

import secrets

from ..request_path import Result, StreamWriter, sse
from . import chat_answers as shapes


def usage(result: Result) -> dict:
    prompt, output = sum(result.prompt_tokens), result.tokens
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + output,
        **({} if result.speculation is None else {"speculation": result.speculation}),
    }


def response(req, model_id: str, result: Result | None, output: list | None = None, status: str | None = None):
    """The whole `response` object; with `result` None, the one a stream opens with (in progress, no output)."""
    if result is not None and output is None:
        completion = result.completions[0]
        content, calls = req.tools.read(req.tool_format, completion.text, cut=completion.finish_reason == "length")
        text = shapes.answer(content) if content else ""
        entries = completion.logprobs if req.logprobs else None
        status = "incomplete" if completion.finish_reason == "length" and not calls else "completed"
        output = ([message_item(text, entries, status)] if content is not None else []) + [
            call_item(call) for call in calls
        ]
    status = status or "in_progress"
    return {
        "id": req.id,
        "object": "response",
        "created_at": req.created,
        "status": status,
        "model": model_id,
        "output": output or [],
        "usage": usage(result) if result is not None else None,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "previous_response_id": None,
        "store": False,  # no state is kept
        "background": False,
        "reasoning": None,
        **req.body,
    }


def message_item(text: str, entries: list | None, status: str, item_id: str | None = None) -> dict:
    return {
        "type": "message",
        "id": item_id or "msg_" + secrets.token_hex(12),
        "status": status,
        "role": "assistant",
        "content": [output_text(text, entries)],
    }


def output_text(text: str, entries: list | None) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": _logprobs(entries)}


def call_item(call, status: str = "completed", item_id: str | None = None, arguments: str | None = None) -> dict:
    return {
        "type": "function_call",
        "id": item_id or "fc_" + secrets.token_hex(12),
        "call_id": call.id,
        "name": call.name,
        "arguments": call.arguments_json if arguments is None else arguments,
        "status": status,
    }


def _logprobs(entries: list | None) -> list:
    """The runtime's per-token entries in the Responses API's shape: {token, bytes, logprob, top_logprobs}."""
    return [shapes.logprobs_entry(entry) for entry in entries or []]


class ResponsesStream(StreamWriter):
    """The events of one streamed response: a message item opened at the first text, closed at the first call
    or the end; each call an item of its own, sent once complete."""

    def __init__(self, req, model_id: str):
        self.req, self.model_id = req, model_id
        self.sequence = 0
        self.output: list = []  # items done
        self.message = None  # the open message item: (id, output index, text so far, entries)
        self.started = False  # content begun (its leading whitespace dropped)
        self.pending: list = []  # log-prob entries not yet sent with a delta
        self.reader = req.tool_format.stream() if req.tools.active else None
        self.calls: dict = {}  # call index -> (item id, output index, call name, call id)

    def send(self, body: dict) -> str:
        body = {**body, "sequence_number": self.sequence}
        self.sequence += 1
        return sse(body, body["type"])

    def opening(self) -> list:
        opened = response(self.req, self.model_id, None)
        return [
            self.send({"type": "response.created", "response": opened}),
            self.send({"type": "response.in_progress", "response": opened}),
        ]

    def event(self, kind: str, value) -> list:
        piece, entries = value
        self.pending += entries or []
        deltas = self.reader.feed(piece.text) if self.reader is not None else [_Content(piece.text)]
        return self._deltas(deltas)

    def closing(self, result: Result) -> list:
        completion = result.completions[0]
        cut = completion.finish_reason == "length"
        out = self._deltas(self.reader.finish(cut)) if self.reader is not None else []
        calls = any(item["type"] == "function_call" for item in self.output)
        status = "incomplete" if completion.finish_reason == "length" and not calls else "completed"
        out += self._close_message(status)  # a message cut by max_output_tokens is as incomplete as its response
        final = response(self.req, self.model_id, result, self.output, status)
        kind = "response.completed" if status == "completed" else "response.incomplete"
        return out + [self.send({"type": kind, "response": final})]

    def error(self, error) -> str:
        return self.send({"type": "error", "code": error.code, "message": error.message, "param": error.param})

    def _deltas(self, deltas: list) -> list:
        out = []
        for delta in deltas:
            if hasattr(delta, "text"):
                out += self._text(delta.text)
            elif self.req.tools.parallel or delta.index == 0:
                out += self._call(delta)
        return out

    def _text(self, text: str) -> list:
        text = text if self.started else shapes.answer(text)
        self.started = self.started or bool(text)
        if not text:
            return []
        out = []
        if self.message is None:
            item_id, index = "msg_" + secrets.token_hex(12), len(self.output)
            self.message = [item_id, index, "", []]
            out.append(self._item("added", message_item("", None, "in_progress", item_id)))
            out.append(self._part("added", output_text("", None)))
        entries, self.pending = self.pending, []
        self.message[2] += text
        self.message[3] += entries
        item_id, index = self.message[:2]
        delta = {"type": "response.output_text.delta", "item_id": item_id, "output_index": index, "content_index": 0}
        return out + [self.send({**delta, "delta": text, "logprobs": _logprobs(entries)})]

    def _close_message(self, status: str = "completed") -> list:
        if self.message is None:
            return []
        item_id, index, text, entries = self.message
        self.message = None
        done = {"type": "response.output_text.done", "item_id": item_id, "output_index": index, "content_index": 0}
        item = message_item(text, entries, status, item_id)
        self.output.append(item)
        return [
            self.send({**done, "text": text, "logprobs": _logprobs(entries)}),
            self._part("done", output_text(text, entries), item_id, index),
            self._item("done", item, index),
        ]

    def _call(self, delta) -> list:
        out = self._close_message()
        if delta.id is not None:  # a call begins: its item is announced
            item_id = "fc_" + secrets.token_hex(12)
            self.calls[delta.index] = (item_id, len(self.output) + len(self.calls), delta.name, delta.id)
            return out
        item_id, index, name, call_id = self.calls.pop(delta.index)
        call = _Call(call_id, name, delta.arguments)
        where = {"item_id": item_id, "output_index": index}
        item = call_item(call, "completed", item_id)
        self.output.append(item)
        return out + [
            self._item("added", call_item(call, "in_progress", item_id, ""), index),
            self.send({"type": "response.function_call_arguments.delta", **where, "delta": delta.arguments}),
            self.send({"type": "response.function_call_arguments.done", **where, "arguments": delta.arguments}),
            self._item("done", item, index),
        ]

    def _item(self, stage: str, item: dict, index: int | None = None) -> str:
        index = self.message[1] if index is None else index
        return self.send({"type": f"response.output_item.{stage}", "output_index": index, "item": item})

    def _part(self, stage: str, part: dict, item_id: str | None = None, index: int | None = None) -> str:
        item_id = self.message[0] if item_id is None else item_id
        index = self.message[1] if index is None else index
        where = {"item_id": item_id, "output_index": index, "content_index": 0}
        return self.send({"type": f"response.content_part.{stage}", **where, "part": part})


class _Content:
    def __init__(self, text: str):
        self.text = text


class _Call:
    def __init__(self, call_id: str, name: str, arguments: str):
        self.id, self.name, self.arguments_json = call_id, name, arguments
