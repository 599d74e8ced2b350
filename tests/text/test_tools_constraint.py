"""tool_choice "required" and a named function become a Lark grammar that llguidance compiles, and whose
matcher (on GPT-2's real tokenizer) accepts the family's own call text with valid arguments and refuses a call
of another function, arguments off the schema, or text around the call."""

import json

import llguidance  # the test extra has it: without it these tests fail, never skip
import pytest
from edgelm.runtime.errors import ChatError
from edgelm.runtime.text.tools import FORMATS
from weather_tools import WEATHER_CLOSED_DAYS_UNIT

CLOCK = {"type": "function", "function": {"name": "now", "description": "No arguments."}}
TOOLS = [WEATHER_CLOSED_DAYS_UNIT, CLOCK]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


@pytest.fixture(scope="module")
def tokenizer(gpt2_tokenizer_dir):
    return llguidance.LLTokenizer(str(gpt2_tokenizer_dir / "tokenizer.json"))


def _accepts(tokenizer, grammar: str, text: str) -> bool:
    matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
    assert not matcher.is_error(), matcher.get_error()
    return matcher.consume_tokens(tokenizer.tokenize_str(text)) and matcher.is_accepting()


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_required_forces_a_valid_call_of_a_tool(tokenizer, name):
    fmt = FORMATS[name]
    kind, grammar = fmt.constraint(TOOLS, "required")
    assert kind == "grammar"
    error, warnings = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, tokenizer)
    assert not error and not warnings
    weather = fmt.call_text([("get_weather", {"city": "Zürich", "days": 3})])
    assert _accepts(tokenizer, grammar, weather)
    assert _accepts(tokenizer, grammar, fmt.call_text([("now", {})]))
    content, calls = fmt.parse(weather)  # what the grammar lets through parses back into the call
    assert content is None and [(c.name, json.loads(c.arguments_json)) for c in calls] == [
        ("get_weather", {"city": "Zürich", "days": 3})
    ]
    for bad in (
        fmt.call_text([("get_weather", {"days": 3})]),  # "city" is required
        fmt.call_text([("get_weather", {"city": "Zürich", "days": 9})]),  # over the maximum
        fmt.call_text([("get_weather", {"city": "Zürich", "unit": "kelvin"})]),  # not in the enum
        fmt.call_text([("get_weather", {"city": "Zürich", "wind": True})]),  # additionalProperties is false
        fmt.call_text([("now", {"tz": "UTC"})]),  # a function without parameters takes none
        fmt.call_text([("delete_files", {})]),  # not a tool
        "Sure! " + weather,  # text before the call
        "The weather is fine.",
    ):
        assert not _accepts(tokenizer, grammar, bad), bad


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_a_named_function_is_the_only_one_allowed(tokenizer, name):
    fmt = FORMATS[name]
    _, grammar = fmt.constraint(TOOLS, NAMED)
    assert _accepts(tokenizer, grammar, fmt.call_text([("get_weather", {"city": "Oslo"})]))
    assert not _accepts(tokenizer, grammar, fmt.call_text([("now", {})]))
    _, responses_style = fmt.constraint(TOOLS, {"type": "function", "name": "now"})  # the Responses API's shape
    assert _accepts(tokenizer, responses_style, fmt.call_text([("now", {})]))


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_parallel_calls_only_where_allowed(tokenizer, name):
    fmt = FORMATS[name]
    two = fmt.call_text([("get_weather", {"city": "Oslo"}), ("now", {})])
    _, parallel = fmt.constraint(TOOLS, "required", parallel=True)
    _, single = fmt.constraint(TOOLS, "required", parallel=False)
    assert _accepts(tokenizer, parallel, two) == fmt.parallel  # Llama 3's template renders one call per answer
    assert not _accepts(tokenizer, single, two)
    assert _accepts(tokenizer, single, fmt.call_text([("now", {})]))


def test_arguments_are_laid_out_as_templates_write_them(tokenizer):
    """json.dumps' separators and no other whitespace: what the model sees of its past calls in the prompt."""
    _, grammar = FORMATS["hermes"].constraint([WEATHER_CLOSED_DAYS_UNIT], "required")
    call = '<tool_call>\n{"name": "get_weather", "arguments": %s}\n</tool_call>'
    assert _accepts(tokenizer, grammar, call % '{"city": "Oslo", "days": 2}')
    for spaced in ('{"city":"Oslo"}', '{ "city": "Oslo"}', '{"city": "Oslo",  "days": 2}', '{\n  "city": "Oslo"\n}'):
        assert not _accepts(tokenizer, grammar, call % spaced), spaced


@pytest.mark.parametrize("choice", ["auto", "none", None])
def test_auto_and_none_need_no_constraint(choice):
    assert FORMATS["hermes"].constraint(TOOLS, choice) is None


@pytest.mark.parametrize(
    "tools, choice, says",
    [
        (None, "required", "needs at least one function"),
        ([], "required", "needs at least one function"),
        (
            TOOLS,
            {"type": "function", "function": {"name": "delete_files"}},
            "'delete_files', which is not among the tools given \\(get_weather, now\\)",
        ),
        (None, NAMED, "not among the tools given \\(none\\)"),
        (TOOLS, {"type": "function"}, "must name the function"),
        (TOOLS, "always", 'must be "none", "auto", "required"'),
        (TOOLS, {"type": "file_search"}, 'got {"type": "file_search"}'),
    ],
)
def test_bad_tool_choice(tools, choice, says):
    with pytest.raises(ChatError, match=says) as caught:
        FORMATS["hermes"].constraint(tools, choice)
    assert caught.value.param == "tool_choice" and "\n" not in str(caught.value)


def test_bad_tools_are_refused_before_a_grammar_is_built():
    with pytest.raises(ChatError, match="of an object") as caught:
        FORMATS["llama3"].constraint([{"type": "function", "function": {"name": "f", "parameters": {}}}], "required")
    assert caught.value.param == "tools[0].function.parameters"
