"""Reading tool calls out of a model's text as it streams: content deltas and tool-call deltas, in OpenAI's shape.

Text before, between and after calls streams as content at once, except a tail that may be the start of a call
(`<tool_c`), which waits for the next piece. A call is sent when its text is complete and parses: a block that
turns out malformed (bad JSON, no name, arguments that are no object) is sent as content, so a client never
sees half a call it must take back. Each call is two deltas, as OpenAI's `delta.tool_calls` chunks carry it:
(index, id, name, arguments="") then (index, None, None, arguments JSON text). Whitespace that only separates
content from calls is dropped; an answer without calls comes through byte for byte. A closing tag inside the
JSON strings of a call is part of its arguments; a block that only closes there (a stray quote) ends, once the
answer does, at its first closing tag, and the text after it is read again.

`ToolFormat.parse(text)` is this stream fed the whole text at once, so parsing after the fact and streaming
agree on every input.
"""

import json
from dataclasses import dataclass


@dataclass(frozen=True)
class ToolCall:
    """One call the model made: `arguments_json` is a JSON object as text, as OpenAI's `function.arguments`."""

    id: str
    name: str
    arguments_json: str

    def as_openai(self) -> dict:
        """The call as an OpenAI `message.tool_calls` entry."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments_json}}


@dataclass(frozen=True)
class ContentDelta:
    """Text of the answer that is not a call."""

    text: str


@dataclass(frozen=True)
class ToolCallDelta:
    """A piece of call `index` (0, 1, ... in the answer): the first carries id and name, the next the arguments."""

    index: int
    id: str | None
    name: str | None
    arguments: str


def new_call_id() -> str:
    import uuid  # only here: a model that never calls a tool does not pay for it

    return "call_" + uuid.uuid4().hex[:24]


class ToolStream:
    """Fed text pieces (`feed`), then `finish(cut)`; each returns the deltas it can send now. `content` and `calls`
    hold what was sent. `cut`: the answer was cut short (max_new_tokens), so a call it ends inside is a cut call,
    dropped: neither a call nor content."""

    def __init__(self):
        self.calls: list[ToolCall] = []
        self._pieces: list[str] = []  # content sent
        self._held = ""  # trailing whitespace of content, sent only if more content follows
        self._after_call = False  # whitespace right after a call is dropped

    @property
    def content(self) -> str:
        return "".join(self._pieces)

    def result(self) -> tuple:
        """(content, calls): content is None when calls took the whole answer."""
        content = self.content
        return (None if self.calls and not content.strip() else content), list(self.calls)

    def feed(self, text: str) -> list:
        raise NotImplementedError

    def finish(self, cut: bool = False) -> list:
        raise NotImplementedError

    def _content(self, text: str, out: list) -> None:
        text = self._held + text
        if self._after_call:
            text = text.lstrip()
        body = text.rstrip()
        self._held = text[len(body) :]
        if body:
            self._pieces.append(body)
            out.append(ContentDelta(body))
            self._after_call = False

    def _calls(self, calls: list, out: list) -> None:
        """`calls`: [(name, arguments dict)] parsed from one complete block."""
        self._held = ""
        for name, arguments in calls:
            call = ToolCall(new_call_id(), name, json.dumps(arguments, ensure_ascii=False))
            index = len(self.calls)
            self.calls.append(call)
            out += [ToolCallDelta(index, call.id, name, ""), ToolCallDelta(index, None, None, call.arguments_json)]
            self._after_call = True

    def _end(self, out: list) -> list:
        if self._held and not self.calls:  # an answer without calls keeps its trailing whitespace
            self._pieces.append(self._held)
            out.append(ContentDelta(self._held))
        self._held = ""
        return out


class TaggedStream(ToolStream):
    """Calls written between `open_tag` and `close_tag` (`<tool_call>...</tool_call>`), anywhere in the answer;
    `parse_block(body)` gives [(name, arguments)] or None for a malformed block."""

    def __init__(self, parse_block, open_tag: str = "<tool_call>", close_tag: str = "</tool_call>"):
        super().__init__()
        self._parse_block, self._open, self._close = parse_block, open_tag, close_tag
        self._buffer = ""  # text not yet sent: a possible start of open_tag, or a block still open
        self._inside = False
        # The open block's scan for close_tag: how far it got, and whether it stopped inside a JSON string, where
        # a close_tag is text of the arguments ({"html": "</tool_call>"}), not the block's end.
        self._searched, self._in_string, self._escaped = 0, False, False

    def feed(self, text: str) -> list:
        out = []
        self._buffer += text
        while True:
            if not self._inside:
                start = self._buffer.find(self._open)
                if start < 0:
                    keep = _prefix_tail(self._buffer, self._open)
                    self._content(self._buffer[: len(self._buffer) - keep], out)
                    self._buffer = self._buffer[len(self._buffer) - keep :]
                    return out
                self._content(self._buffer[:start], out)
                self._buffer, self._inside = self._buffer[start:], True
                self._searched, self._in_string, self._escaped = len(self._open), False, False
            end = self._find_close()
            if end < 0:
                return out
            block, self._buffer = self._buffer[: end + len(self._close)], self._buffer[end + len(self._close) :]
            self._inside = False
            self._block(block, block[len(self._open) : end], out)

    def finish(self, cut: bool = False) -> list:
        out = []
        while self._inside and (end := self._buffer.find(self._close, len(self._open))) >= 0:
            # closed only inside a string: malformed, so it ends where a plain reading ends it
            block, rest = self._buffer[: end + len(self._close)], self._buffer[end + len(self._close) :]
            self._buffer, self._inside = "", False
            self._content(block, out)
            out += self.feed(rest)
        if self._inside:  # a block the answer ended in (cut by a stop or the length): a call if it parses
            self._block(self._buffer, self._buffer[len(self._open) :], out, cut)
        elif not cut or not _prefix_tail(self._buffer, self._open):  # a cut opening tag (`<tool_c`) is dropped
            self._content(self._buffer, out)
        self._buffer, self._inside = "", False
        return self._end(out)

    def _find_close(self) -> int:
        """Where close_tag ends the open block (outside JSON strings), or -1 for not yet; scans each character once."""
        text, at = self._buffer, self._searched
        while at < len(text):
            char = text[at]
            if self._in_string:
                if self._escaped:
                    self._escaped = False
                elif char == "\\":
                    self._escaped = True
                elif char == '"':
                    self._in_string = False
            elif char == '"':
                self._in_string = True
            elif char == "<" and self._close.startswith(text[at : at + len(self._close)]):
                if len(text) - at < len(self._close):
                    break  # the end of the text may be the start of close_tag: look again with the next piece
                return at
            at += 1
        self._searched = at
        return -1

    def _block(self, block: str, body: str, out: list, cut: bool = False) -> None:
        calls = self._parse_block(body)
        if calls is not None:
            self._calls(calls, out)
        elif not cut:
            self._content(block, out)


class JsonAnswerStream(ToolStream):
    """Calls written as the whole answer, one or more JSON objects after an optional `tag` (Llama 3's
    `<|python_tag|>`): an answer that starts with `{` or the tag is held to its end, since only then is it known
    to be calls; any other answer streams. `parse_answer(text)` gives [(name, arguments)] or None."""

    def __init__(self, parse_answer, tag: str = ""):
        super().__init__()
        self._parse_answer, self._tag = parse_answer, tag
        self._buffer = ""
        self._mode = "start"  # "start": only whitespace (or part of the tag) so far; "hold": maybe calls; "text"

    def feed(self, text: str) -> list:
        out = []
        if self._mode == "text":
            self._content(text, out)
            return out
        self._buffer += text
        if self._mode == "start":
            head = self._buffer.lstrip()
            if head.startswith("{") or (self._tag and head.startswith(self._tag)):
                self._mode = "hold"
            elif head and not (self._tag and self._tag.startswith(head)):
                self._mode = "text"
                self._content(self._buffer, out)
                self._buffer = ""
        return out

    def finish(self, cut: bool = False) -> list:
        out = []
        calls = self._parse_answer(self._buffer) if self._mode == "hold" else None
        if calls is None and cut and self._mode == "hold" and _starts_call(self._buffer, self._tag):
            pass  # a call cut short: dropped
        elif calls is None:
            self._content(self._buffer, out)
        else:
            self._calls(calls, out)
        self._buffer, self._mode = "", "text"
        return self._end(out)


def _starts_call(text: str, tag: str) -> bool:
    """Whether held text opens a call: the tag, or an object whose first key is "name"."""
    head = text.lstrip()
    if tag and head.startswith(tag):
        return True
    rest = head[1:].lstrip()
    return head.startswith("{") and ('"name"'.startswith(rest) or rest.startswith('"name"'))


def _prefix_tail(text: str, tag: str) -> int:
    """Length of the longest end of `text` that is a start of `tag` (and so may become it)."""
    for size in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-size:]):
            return size
    return 0
