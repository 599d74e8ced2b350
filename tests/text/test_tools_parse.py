"""Each family's tool-call text parses into calls, streams into OpenAI-shaped deltas (split anywhere, down to one
character per piece, with the same result), and a malformed call stays content without an exception."""

import json

import pytest
from edgelm.runtime.text.tools import FORMATS, ContentDelta, ToolCallDelta
from hypothesis import given, settings
from hypothesis import strategies as st

HERMES, LLAMA3, SMOLLM2, EDGELM = (FORMATS[n] for n in ("hermes", "llama3", "smollm2", "edgelm"))
PARIS = '{"city": "Paris"}'

# (format, model text, expected content, expected [(name, arguments_json)])
CASES = [
    (
        HERMES,
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        None,
        [("get_weather", PARIS)],
    ),
    (
        HERMES,
        'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>',
        "Let me look.",
        [("get_weather", PARIS), ("now", "{}")],
    ),
    (HERMES, '<tool_call>{"name":"now"}</tool_call> Done.', "Done.", [("now", "{}")]),  # no arguments: none
    (
        HERMES,
        '<tool_call>\n{"name": "f", "arguments": "{\\"a\\": [1, {\\"b\\": null}]}"}\n</tool_call>',
        None,
        [("f", '{"a": [1, {"b": null}]}')],
    ),
    (
        HERMES,
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}',
        None,
        [("get_weather", PARIS)],
    ),  # cut after the call
    (
        HERMES,
        'Émile: {"x": "<tool"} and <b>bold</b>  \n',
        'Émile: {"x": "<tool"} and <b>bold</b>  \n',
        [],
    ),  # no call: as is
    (HERMES, "Hi <tool_call", "Hi <tool_call", []),
    (  # a closing tag inside the arguments' strings is text of the arguments
        HERMES,
        '<tool_call>\n{"name": "f", "arguments": {"html": "<tool_call>\\"</tool_call>"}}\n</tool_call>',
        None,
        [("f", '{"html": "<tool_call>\\"</tool_call>"}')],
    ),
    (  # a stray quote: the block ends at its first closing tag, and what follows is read again
        EDGELM,
        'Say "hi <tool_call>"oops</tool_call> then <tool_call>{"name": "now"}</tool_call>',
        'Say "hi <tool_call>"oops</tool_call> then',
        [("now", "{}")],
    ),
    (LLAMA3, '{"name": "get_weather", "parameters": {"city": "Paris"}}', None, [("get_weather", PARIS)]),
    (
        LLAMA3,
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}<|eom_id|>',
        None,
        [("get_weather", PARIS)],
    ),
    (
        LLAMA3,
        '  {"name": "a", "parameters": {}}; {"name": "b", "arguments": {"k": 1}}\n',
        None,
        [("a", "{}"), ("b", '{"k": 1}')],
    ),
    (LLAMA3, 'It is sunny. {"name": "a", "parameters": {}}', 'It is sunny. {"name": "a", "parameters": {}}', []),
    (LLAMA3, '{"answer": 42}', '{"answer": 42}', []),  # JSON that is no call is an answer
    (
        SMOLLM2,
        '<tool_call>[\n{"name": "get_weather", "arguments": {"city": "Paris"}},\n{"name": "now", "arguments": {}}\n]</tool_call>',
        None,
        [("get_weather", PARIS), ("now", "{}")],
    ),
    (SMOLLM2, '<tool_call>{"name": "now", "arguments": {}}</tool_call>', None, [("now", "{}")]),  # one call, no list
    (SMOLLM2, "<tool_call>[]</tool_call>", "", []),  # its prompt's way of saying "no call"
    (
        EDGELM,
        ' <tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call><tool_call>{"name": "now", "arguments": {}}</tool_call>',
        None,
        [("get_weather", PARIS), ("now", "{}")],
    ),
    (EDGELM, "Plain answer.", "Plain answer.", []),
]
MALFORMED = [  # each is left as content, whole
    (HERMES, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par\n</tool_call>'),
    (HERMES, '<tool_call>\n{"arguments": {}}\n</tool_call>'),  # no name
    (HERMES, '<tool_call>\n{"name": "", "arguments": {}}\n</tool_call>'),
    (HERMES, '<tool_call>\n{"name": "f", "arguments": [1, 2]}\n</tool_call>'),  # arguments no object
    (HERMES, '<tool_call>\n{"name": "f", "arguments": "not json"}\n</tool_call>'),
    (HERMES, '<tool_call>\n["f"]\n</tool_call>'),
    (HERMES, "<tool_call>\n" + "[" * 5000 + "\n</tool_call>"),  # deeper than the JSON reader goes
    (HERMES, '<tool_call>\n{"name": "f", "arguments": {}} {"name": "g"}\n</tool_call>'),
    (HERMES, '<tool_call>\n{"name": "get_weather", "arguments": {"ci'),  # cut inside the call
    (LLAMA3, '{"name": "get_weather", "parameters": {"city": "Paris"}} and more'),
    (LLAMA3, '{"name": "get_weather", "parameters": {"city": "Pa'),
    (LLAMA3, '<|python_tag|>brave_search.call(query="weather")'),  # a built-in tool: not a JSON call
    (SMOLLM2, '<tool_call>[{"name": "f", "arguments": {}}, 3]</tool_call>'),
    (EDGELM, '<tool_call>{"name": 7}</tool_call>'),
]


def _calls(calls):
    return [(c.name, c.arguments_json) for c in calls]


def _streamed(fmt, pieces):
    """(content, calls, deltas) from feeding `pieces` one by one."""
    stream = fmt.stream()
    deltas = [d for piece in pieces for d in stream.feed(piece)] + stream.finish()
    content, calls = stream.result()
    return content, calls, deltas


@pytest.mark.parametrize("fmt, text, content, calls", CASES)
def test_parse(fmt, text, content, calls):
    parsed_content, parsed = fmt.parse(text)
    assert parsed_content == content and _calls(parsed) == calls
    assert all(c.id.startswith("call_") for c in parsed) and len({c.id for c in parsed}) == len(parsed)
    for call in parsed:
        assert call.as_openai() == {
            "id": call.id,
            "type": "function",
            "function": {"name": call.name, "arguments": call.arguments_json},
        }
        assert isinstance(json.loads(call.arguments_json), dict)


@pytest.mark.parametrize("fmt, text, content, calls", CASES)
@pytest.mark.parametrize("split", ["whole", "characters", "pairs"])
def test_stream_gives_what_parse_gives(fmt, text, content, calls, split):
    pieces = {"whole": [text], "characters": list(text), "pairs": [text[i : i + 2] for i in range(0, len(text), 2)]}
    streamed_content, streamed, deltas = _streamed(fmt, pieces[split])
    assert (streamed_content, _calls(streamed)) == (content, calls)
    assert "".join(d.text for d in deltas if isinstance(d, ContentDelta)) == (content or "")
    call_deltas = [d for d in deltas if isinstance(d, ToolCallDelta)]
    assert call_deltas == [
        delta
        for i, call in enumerate(streamed)
        for delta in (ToolCallDelta(i, call.id, call.name, ""), ToolCallDelta(i, None, None, call.arguments_json))
    ]


@pytest.mark.parametrize("fmt, text", MALFORMED)
def test_malformed_calls_stay_content(fmt, text):
    assert fmt.parse(text) == (text, [])
    content, calls, deltas = _streamed(fmt, list(text))
    assert (content, calls) == (text, []) and all(isinstance(d, ContentDelta) for d in deltas)


# (format, an answer cut by max_new_tokens, the content, the calls it completed)
CUT = [
    (HERMES, '<tool_call>\n{"name": "get_weather", "arguments": {"ci', None, []),
    (
        HERMES,
        'Looking.\n<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>\n<tool_call>\n{"name": "get_w',
        "Looking.",
        [("now", "{}")],
    ),
    (EDGELM, '<tool_call>{"name": "now", "arguments": {}}</tool_call><tool_c', None, [("now", "{}")]),
    (EDGELM, "Sure. <tool_call>{", "Sure. ", []),
    (SMOLLM2, '<tool_call>[\n{"name": "now", "arguments": {}},\n{"name": "get_', None, []),
    (LLAMA3, '{"name": "get_weather", "parameters": {"city": "Pa', None, []),
    (LLAMA3, '<|python_tag|>{"name": "get_weather", "param', None, []),
    (LLAMA3, '{"answer": 4', '{"answer": 4', []),  # JSON content, not a call: kept as the text it is
    (HERMES, "Plain text cut short", "Plain text cut short", []),
]


@pytest.mark.parametrize("fmt, text, content, calls", CUT)
def test_a_call_cut_short_is_dropped_never_content(fmt, text, content, calls):
    parsed_content, parsed = fmt.parse(text, cut=True)
    assert (parsed_content or None, _calls(parsed)) == (content, calls)
    for split in ([text], list(text)):
        stream = fmt.stream()
        deltas = [d for piece in split for d in stream.feed(piece)] + stream.finish(cut=True)
        streamed = "".join(d.text for d in deltas if isinstance(d, ContentDelta))
        assert (streamed or None, _calls(stream.result()[1])) == (content, calls)
        assert "<tool_call>" not in streamed and '"name"' not in streamed
    if content is None or "<" in text:  # not cut, the same text is content: the malformed block it ends in
        assert fmt.parse(text)[0] != parsed_content


def test_content_before_a_call_streams_before_the_call_ends():
    stream = HERMES.stream()
    assert stream.feed("Let me check") == [ContentDelta("Let me check")]
    assert stream.feed(" <tool_c") == []  # a space before a call is dropped, and "<tool_c" may start one
    assert stream.feed('all>\n{"name": "now", "arguments": {}}') == []
    first, second = stream.feed("\n</tool_call>")
    assert (first.index, first.name, first.arguments, second.arguments) == (0, "now", "", "{}") and first.id
    assert stream.feed("\nDone.") == [ContentDelta("Done.")]
    assert stream.finish() == [] and stream.result()[0] == "Let me checkDone."
    plain = LLAMA3.stream()
    assert plain.feed("  ") == [] and plain.feed("Sunny") == [ContentDelta("  Sunny")]  # no JSON: streams at once
    held = LLAMA3.stream()
    assert held.feed('{"name": "now", "parameters": {}}') == []  # held: only the end tells a call from an answer
    assert [d.name for d in held.finish()] == ["now", None]


def test_many_malformed_blocks_parse_without_an_exception():
    text = '<tool_call>"</tool_call>' * 3000 + '<tool_call>{"name": "now"}</tool_call>'
    assert _calls(EDGELM.parse(text)[1]) == [("now", "{}")]
    assert EDGELM.parse(text)[0] == '<tool_call>"</tool_call>' * 3000


def test_non_text_input_parses_as_empty():
    assert HERMES.parse(None) == ("", [])


PIECES = ["<tool_call>", "</tool_call>", "<tool_", "call>", "\n", " ", "{", "}", "[", "]", '"name"', ": ", '"f"', ", ",
          '"arguments"', '"parameters"', "{}", "<|python_tag|>", "; ", "é", "text", '"', "\\", "null", "1"]  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(PIECES), max_size=30), st.sampled_from(sorted(FORMATS)), st.randoms())
def test_any_text_parses_and_streams_alike_without_an_exception(pieces, name, random):
    fmt, text = FORMATS[name], "".join(pieces)
    content, calls = fmt.parse(text)
    cuts = sorted(random.sample(range(len(text) + 1), min(len(text) + 1, 6)))
    parts = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
    streamed_content, streamed, _ = _streamed(fmt, parts)
    assert (streamed_content, _calls(streamed)) == (content, _calls(calls))
    if not calls:
        assert content == text  # nothing taken out of an answer without calls
