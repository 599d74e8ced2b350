"""What a constraint may ask, decided before generation (runtime/constraint_bounds.py): a bounded JSON
number has a bounded number of digits, so that schema answers end; too many choices are refused naming
`choices` and the bound."""

import itertools
import json

import llguidance  # noqa: F401  (the test extra has it: without it these tests fail, never skip)
import pytest
from edgelm.runtime.errors import GenerationOptionError
from edgelm.runtime.generation_config import GenerationConfig
from edgelm.runtime.sampling.constraint import Compiler, grammar_text
from edgelm.runtime.constraint_bounds import MAX_CHOICES, NUMBER_DECIMALS, bounded_numbers
from edgelm.runtime.text.tools import FORMATS

UNIT = {"type": "number", "minimum": 0, "maximum": 1}


@pytest.fixture(scope="module")
def compiler(gpt2_tokenizer_dir):
    return Compiler((gpt2_tokenizer_dir / "tokenizer.json").read_text(), 50257, (50256,))


def _accepts(compiler, kind, value, text: str) -> tuple:
    """(whether the constraint accepts `text` whole, whether nothing may follow it)."""
    row = compiler.compile(kind, value).row()
    ok = row.matcher.consume_tokens(compiler.tokenizer().tokenize_str(text))
    return ok and row.matcher.is_accepting(), row.matcher.is_stopped()


def test_a_bounded_number_has_bounded_digits(compiler):
    schema = json.dumps({"type": "object", "properties": {"p": UNIT}, "required": ["p"]})
    digits = "0." + "1" * NUMBER_DECIMALS
    assert _accepts(compiler, "json_schema", schema, '{"p":%s}' % digits)[0]
    assert not _accepts(compiler, "json_schema", schema, '{"p":%s1}' % digits)[0]
    assert _accepts(compiler, "json_schema", json.dumps(UNIT), digits) == (True, True)  # nothing may follow
    for fine in ("0", "1", "0.5", "1.0"):
        assert _accepts(compiler, "json_schema", json.dumps(UNIT), fine)[0], fine
    # a range's own scale counts: 0 to 0.001 keeps six decimals past it
    tiny = json.dumps({"type": "number", "exclusiveMinimum": 0, "maximum": 0.001})
    assert _accepts(compiler, "json_schema", tiny, "0.000123456")[0]
    assert not _accepts(compiler, "json_schema", tiny, "0.0001234567")[0]


def test_a_number_of_the_schemas_own_precision_or_unbounded_is_left_alone(compiler):
    own = json.dumps({**UNIT, "multipleOf": 0.25})
    assert _accepts(compiler, "json_schema", own, "0.75")[0] and not _accepts(compiler, "json_schema", own, "0.7")[0]
    free = json.dumps({"type": "number", "minimum": 0})  # bounded on one side only: digits as the model likes
    assert _accepts(compiler, "json_schema", free, "0." + "1" * 12) == (True, False)
    assert bounded_numbers({"type": "integer", "minimum": 0, "maximum": 9}) == {
        "type": "integer",
        "minimum": 0,
        "maximum": 9,
    }
    data = {"const": UNIT, "enum": [UNIT], "properties": {"x": UNIT}}  # values are data, not schemas
    out = bounded_numbers(data)
    assert out["const"] == UNIT and out["enum"] == [UNIT] and "multipleOf" in out["properties"]["x"]
    assert data["properties"]["x"] == UNIT  # the caller's schema is not changed


def test_sampled_answers_with_bounded_numbers_end(model):
    """A model that would rather write digits than anything else (logit_bias), under a schema of bounded numbers:
    every answer still ends well within max_new_tokens."""
    schema = {
        "type": "object",
        "properties": {"p": UNIT, "t": {"type": "number", "minimum": -50, "maximum": 50}},
        "required": ["p", "t"],
        "additionalProperties": False,
    }
    digits = {model.encode(str(d), add_special_tokens=False)[0]: 20.0 for d in range(1, 10)}
    replies = model.generate(
        ["A: ", "B: "], json_schema=schema, max_new_tokens=60, do_sample=True, seed=3, num_return_sequences=3,
        logit_bias=digits,
    )
    for reply in replies:
        assert reply.finish_reason == "stop", reply.text
        value = json.loads(reply.text)
        assert 0 <= value["p"] <= 1 and -50 <= value["t"] <= 50


def test_a_forced_calls_bounded_numbers_have_bounded_digits(compiler):
    parameters = {"type": "object", "properties": {"p": UNIT}}
    tool = {"type": "function", "function": {"name": "set", "parameters": parameters}}
    fmt = FORMATS["edgelm"]
    kind, grammar = fmt.constraint([tool], "required")
    assert _accepts(compiler, kind, grammar, fmt.call_text([("set", {"p": 0.123456})]))[0]
    assert not _accepts(compiler, kind, grammar, fmt.call_text([("set", {"p": 0.1234567})]))[0]


def test_too_many_choices_are_refused_before_generation_naming_the_bound(compiler):
    words = ("".join(p) for p in itertools.product("abcdefghij", repeat=4))
    many = tuple(itertools.islice(words, MAX_CHOICES + 1))
    with pytest.raises(GenerationOptionError, match=f"choices has {MAX_CHOICES + 1:,} strings, over the "
                       f"{MAX_CHOICES:,}") as caught:
        GenerationConfig(choices=many)
    assert caught.value.param == "choices" and "\n" not in str(caught.value)
    with pytest.raises(GenerationOptionError, match="choices"):
        grammar_text("choices", tuple(chr(0x4E00 + i) for i in range(60_000)))  # refused before any compile
    allowed = many[:MAX_CHOICES]  # the most allowed: the last one can be written to its end
    assert _accepts(compiler, "choices", allowed, allowed[-1])[0]
