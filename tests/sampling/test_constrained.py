"""Constrained generation (runtime/sampling/constraint.py) on the tiny random fp32 package, the worst case: a model
whose every token is as likely as any, so only the constraint keeps the output in shape. Every output that is not
cut by max_new_tokens parses and is valid under its schema; the constrained distribution is the model's,
renormalized over the allowed tokens; regex, grammar, choices and json_object hold; bad constraints are refused with
one line naming the option."""

import json
import re

import jsonschema
import llguidance  # noqa: F401  (the test extra has it: without it these tests fail, never skip)
import numpy as np
import pytest
from edgelm.runtime import load
from edgelm.runtime.errors import GenerationOptionError
from edgelm.runtime.generation_config import GenerationConfig
from edgelm.runtime.sampling import SamplerChain, log_softmax
from edgelm.runtime.sampling import constraint as constraint_module

DIGIT = {"type": "integer", "minimum": 0, "maximum": 9}
SCHEMAS = {
    "nested objects": {
        "type": "object",
        "properties": {
            "user": {
                "type": "object",
                "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 999}, "ok": {"type": "boolean"}},
                "required": ["id", "ok"],
                "additionalProperties": False,
            }
        },
        "required": ["user"],
        "additionalProperties": False,
    },
    "array bounds": {"type": "array", "items": DIGIT, "minItems": 2, "maxItems": 4},
    "enums": {
        "type": "object",
        "properties": {"color": {"enum": ["red", "green", "blue"]}, "size": {"enum": [1, 2, 3, None]}},
        "required": ["color", "size"],
        "additionalProperties": False,
    },
    "number ranges": {
        "type": "object",
        "properties": {
            "n": {"type": "integer", "exclusiveMinimum": 0, "maximum": 50},
            "t": {"type": "integer", "minimum": -5, "maximum": 5},
        },
        "required": ["n", "t"],
        "additionalProperties": False,
    },
    "patterns and formats": {
        "type": "object",
        "properties": {
            "code": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{2}$"},
            "day": {"type": "string", "format": "date"},
        },
        "required": ["code", "day"],
        "additionalProperties": False,
    },
    "optional fields": {
        "type": "object",
        "properties": {"a": DIGIT, "b": {"type": "string", "maxLength": 3}, "c": {"type": "boolean"}},
        "required": ["a"],
        "additionalProperties": False,
    },
    "anyOf": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 99}, {"type": "string", "maxLength": 4}]},
    "$defs refs": {
        "$defs": {
            "point": {
                "type": "object",
                "properties": {"x": DIGIT, "y": DIGIT},
                "required": ["x", "y"],
                "additionalProperties": False,
            }
        },
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/point"}, "b": {"$ref": "#/$defs/point"}},
        "required": ["a", "b"],
        "additionalProperties": False,
    },
}


def test_sampled_outputs_parse_and_validate_under_every_schema(model):
    """200 generations at temperature 1 (25 per schema, top_k off): each that ends by itself is valid JSON under its
    schema, and Completion.parsed is that value; most end by themselves within max_new_tokens."""
    ended = 0
    for k, (name, schema) in enumerate(SCHEMAS.items()):
        completions = model.generate(
            ["{"], json_schema=schema, do_sample=True, top_k=0, seed=k, num_return_sequences=25, max_new_tokens=60
        )
        for c in completions:
            assert c.constraint == "json_schema"
            if c.finish_reason == "length":
                assert c.parsed is None
                continue
            assert c.finish_reason == "stop"
            value = json.loads(c.text)
            jsonschema.validate(value, schema, format_checker=jsonschema.FormatChecker())
            assert c.parsed == value, name
            ended += 1
    assert ended >= 150, f"only {ended} of 200 outputs ended within max_new_tokens"


def test_schema_as_json_text_or_a_model_class_with_model_json_schema(model):
    class Point:  # what a pydantic model class offers; the runtime never imports pydantic
        @staticmethod
        def model_json_schema():
            return SCHEMAS["$defs refs"]["$defs"]["point"]

    for schema in (json.dumps(Point.model_json_schema()), Point):
        c = model.generate("Hi", json_schema=schema, max_new_tokens=30)
        assert c.finish_reason == "stop" and set(c.parsed) == {"x", "y"}
    assert model.settings(json_schema=Point).json_schema == json.dumps(Point.model_json_schema())


def test_constrained_distribution_is_the_model_renormalized_over_the_allowed_tokens():
    """On hand-written logits: the mask (the chain's first filter) leaves allowed logits as they are and the rest -inf,
    so log-softmax over them equals the model's log-probs renormalized over the allowed set; every pick, greedy or
    sampled with any filter, is an allowed token."""
    rng = np.random.default_rng(0)
    vocab = 300
    logits = rng.normal(0, 3, (3, vocab)).astype(np.float32)
    allowed = np.zeros((3, vocab), dtype=bool)
    allowed[0, [5, 17, 250, 299]] = True
    allowed[1] = rng.random(vocab) < 0.5
    allowed[2] = True  # a row without a constraint
    bitmask = np.packbits(np.pad(allowed, ((0, 0), (0, 20))), axis=1, bitorder="little").view(np.int32)
    assert bitmask.shape == (3, constraint_module.words(vocab))
    chain = SamplerChain(GenerationConfig(do_sample=False, vocab_size=vocab), vocab)
    masked = chain.constrain(logits.copy(), bitmask)
    assert np.array_equal(masked[allowed], logits[allowed]) and np.all(masked[~allowed] == -np.inf)
    model_logprobs = log_softmax(logits)
    for row in range(3):
        kept = model_logprobs[row, allowed[row]]
        renormalized = kept - np.logaddexp.reduce(kept.astype(np.float64))
        np.testing.assert_allclose(log_softmax(masked)[row, allowed[row]], renormalized, atol=1e-5)
    assert np.array_equal(chain(masked, [[]] * 3, [[]] * 3, []), np.where(allowed, logits, -np.inf).argmax(-1))
    settings = [dict(), dict(temperature=0.7, top_k=3), dict(top_p=0.5, top_k=0), dict(min_p=0.2, top_k=0)]
    for options in settings:
        chain = SamplerChain(GenerationConfig(do_sample=True, vocab_size=vocab, **options), vocab)
        rngs = [np.random.default_rng(i) for i in range(3)]
        for _ in range(200):
            picks = chain(chain.constrain(logits.copy(), bitmask), [[]] * 3, [[]] * 3, rngs)
            assert all(allowed[r, t] for r, t in enumerate(picks)), options
    # the sampled frequencies follow the renormalized distribution (row 0: four tokens)
    chain = SamplerChain(GenerationConfig(do_sample=True, top_k=0, vocab_size=vocab), vocab)
    rngs = [np.random.default_rng(7)]
    counts = np.bincount(
        [int(chain(chain.constrain(logits[:1].copy(), bitmask[:1]), [[]], [[]], rngs)[0]) for _ in range(4000)],
        minlength=vocab,
    )
    expected = np.exp(log_softmax(np.where(allowed[:1], logits[:1], -np.inf))[0]) * 4000
    assert np.abs(counts - expected).max() < 5 * np.sqrt(expected.max()) + 5


def test_logprobs_are_of_the_constrained_distribution(model):
    c = model.generate("Is it?", choices=["yes", "no"], logprobs=5, max_new_tokens=5)
    first = c.logprobs[0]
    alternatives = {entry["token"] for entry in first["top_logprobs"]}
    assert alternatives <= {"y", "ye", "yes", "n", "no"}, alternatives  # only what the grammar allows is listed
    total = sum(np.exp(entry["logprob"]) for entry in first["top_logprobs"])
    assert total == pytest.approx(1.0, abs=1e-4)  # all of the (renormalized) mass is on them


def test_regex_grammar_choices_and_json_object(model):
    for c in model.generate(["A", "B"], regex=r"[0-9]{3}-[a-z]{2}", do_sample=True, seed=1, num_return_sequences=4):
        assert re.fullmatch(r"[0-9]{3}-[a-z]{2}", c.text) and c.finish_reason == "stop" and c.parsed is None
    lark = 'start: "(" NUM ("," NUM)* ")"\nNUM: /[0-9]{1,2}/'
    for c in model.generate(["A"], grammar=lark, do_sample=True, seed=2, num_return_sequences=8, max_new_tokens=40):
        assert c.finish_reason == "length" or re.fullmatch(r"\([0-9]{1,2}(,[0-9]{1,2})*\)", c.text)
    choices = ["yes", "no", "maybe not"]
    picked = model.generate(["A"], choices=choices, do_sample=True, seed=3, num_return_sequences=12)
    assert all(c.text in choices and c.parsed == c.text and c.finish_reason == "stop" for c in picked)
    assert len({c.text for c in picked}) > 1  # sampling chooses among them
    objects = model.generate(["A"], json_object=True, do_sample=True, seed=4, num_return_sequences=16)
    for c in objects:
        if c.finish_reason == "stop":
            assert isinstance(json.loads(c.text), dict) and c.parsed == json.loads(c.text)
    assert any(c.finish_reason == "stop" for c in objects)


def test_a_row_cut_by_length_keeps_its_text_and_ends_where_the_grammar_may_end(model):
    cut = model.generate("A", regex="[a-z]{20}", max_new_tokens=5, do_sample=True, seed=1)
    assert cut.finish_reason == "length" and cut.parsed is None and re.fullmatch("[a-z]+", cut.text)
    # ignore_eos does not outlast the grammar: the row ends where nothing can follow
    done = model.generate("A", regex="ab", ignore_eos=True, max_new_tokens=20)
    assert (done.text, done.finish_reason) == ("ab", "stop")
    # end-of-text only where the grammar may end: "a" alone is never a whole output of "ab?c"
    for c in model.generate(["A"], regex="ab?c", do_sample=True, seed=5, num_return_sequences=8):
        assert c.text in ("ac", "abc")


def test_a_constrained_answer_cut_by_a_stop_string_says_it_was_cut(model):
    # the Python API reports the cut (the server refuses stop with a constraint): the string named, nothing parsed
    cut = model.generate("A", json_schema=json.dumps({"const": "STOPWORD"}), stop=["STOP"], max_new_tokens=20)
    assert (cut.text, cut.finish_reason, cut.stop_string, cut.parsed) == ('"', "stop", "STOP", None)
    whole = model.generate("A", json_schema=json.dumps({"const": "STOPWORD"}), max_new_tokens=20)
    assert (whole.text, whole.stop_string, whole.parsed) == ('"STOPWORD"', None, "STOPWORD")


def test_greedy_and_seeded_rows_are_the_same_alone_and_in_a_batch(model):
    options = dict(json_schema=SCHEMAS["enums"], max_new_tokens=30)
    alone = [model.generate(p, **options).text for p in ("Hi", "The quick brown")]
    assert [c.text for c in model.generate(["Hi", "The quick brown"], **options)] == alone
    sampled = dict(options, do_sample=True, seed=11, num_return_sequences=3)
    assert [c.text for c in model.generate(["Hi"], **sampled)] == [c.text for c in model.generate(["Hi"], **sampled)]


def test_the_prefix_cache_leaves_constrained_outputs_alone(tiny_package, model, monkeypatch):
    from edgelm.runtime.engine import decode as engine

    monkeypatch.setattr(engine, "PREFILL_CHUNK", 16)  # the tiny model has 64 positions: prompts of two chunks
    cached = load(tiny_package, prefix_cache_mb=1)
    prompt = list(range(40))
    options = dict(json_schema=SCHEMAS["optional fields"], max_new_tokens=20, do_sample=True, seed=2)
    expected = model.generate([prompt], **options)[0].text
    assert [cached.generate([prompt], **options)[0].text for _ in range(2)] == [expected, expected]
    assert cached.engine.prefix_cache.reused_tokens == 32  # the second call restored two chunks


def test_a_stream_of_a_constrained_row(model):
    stream = model.stream("Hi", choices=["alpha", "beta"], max_new_tokens=8)
    text = "".join(stream)
    assert text in ("alpha", "beta") and stream.completion.parsed == text


BAD = [
    (dict(json_schema="{not json"), "json_schema", "not valid JSON"),
    (dict(json_schema={"type": "strang"}), "json_schema", "strang"),
    (dict(json_schema=42), "json_schema", "must be a JSON schema"),
    (dict(json_schema={"type": "object", "unevaluatedProperties": False}), "json_schema", "unevaluatedProperties"),
    (dict(json_schema={"type": "string", "format": "nonsense"}), "json_schema", "nonsense"),
    (dict(json_schema={"type": "string", "pattern": "(a"}), "json_schema", "unclosed group"),
    (dict(regex="a("), "regex", "unclosed group"),
    (dict(regex=""), "regex", "non-empty string"),
    (dict(grammar="start: foo"), "grammar", "foo"),
    (dict(grammar=7), "grammar", "non-empty string"),
    (dict(choices=[]), "choices", "non-empty list"),
    (dict(choices="yes"), "choices", "non-empty list"),
    (dict(choices=["a", ""]), "choices", "non-empty list"),
    (dict(json_object="yes"), "json_object", "true or false"),
    (dict(regex="a", choices=["a"]), "choices", "at most one constraint"),
    (dict(json_object=True, json_schema={"type": "object"}), "json_object", "at most one constraint"),
    (dict(regex="x" * (constraint_module.MAX_TEXT + 1)), "regex", "at most"),
]


@pytest.mark.parametrize("options, param, words", BAD, ids=[b[1] + ":" + b[2][:20] for b in BAD])
def test_every_bad_constraint_is_one_clear_line(model, options, param, words):
    with pytest.raises(GenerationOptionError) as caught:
        model.generate("Hi", **options)
    message = str(caught.value)
    assert caught.value.param == param and words in message and "\n" not in message and len(message) < 400


def test_a_grammar_over_the_compile_limits_is_refused(model, monkeypatch):
    monkeypatch.setitem(constraint_module.LIMITS, "initial_lexer_fuel", 50)  # as a far larger grammar would need
    monkeypatch.setattr(constraint_module, "_grammar_texts", type(constraint_module._grammar_texts)())
    with pytest.raises(GenerationOptionError, match="too complex to compile within edgelm's limits") as caught:
        model.settings(json_schema={"type": "string", "pattern": "[a-z]{3,9}x"})
    assert caught.value.param == "json_schema"


def test_a_constraint_that_cannot_finish_within_max_new_tokens_is_refused(model):
    with pytest.raises(GenerationOptionError, match="needs at least .* tokens, more than max_new_tokens=2") as caught:
        model.generate("Hi", choices=["a long answer", "another long answer"], max_new_tokens=2)
    assert caught.value.param == "max_new_tokens"
    with pytest.raises(GenerationOptionError, match="max_new_tokens=3"):  # the forced start is longer
        model.generate(
            "Hi",
            json_schema={"type": "object", "properties": {"a_long_key_name": DIGIT}, "required": ["a_long_key_name"]},
            max_new_tokens=3,
        )


def test_a_schema_no_output_can_satisfy_is_refused_when_it_is_compiled(model):
    settings = model.settings(json_schema={"$ref": "#"})  # valid JSON Schema, but it only refers to itself
    with pytest.raises(GenerationOptionError, match="json_schema constraint allows no output") as refused:
        model.compile_constraint(settings)
    assert refused.value.param == "json_schema"


def test_an_end_id_of_the_settings_that_the_grammar_allows_is_output_not_an_end(model):
    brace = model.encode("}")[0]  # an ordinary token to the grammar: it must not end the row early
    for seed in range(6):
        c = model.generate("hi", json_object=True, eos_token_id=brace, do_sample=True, seed=seed, max_new_tokens=40)
        assert c.finish_reason == "length" or (c.finish_reason == "stop" and isinstance(c.parsed, dict)), c.text


def test_a_package_never_sets_a_constraint():
    config = GenerationConfig.from_generation_config_json({"regex": "a", "choices": ["x"], "max_new_tokens": 5})
    assert config.constraint is None and config.max_new_tokens == 5


def test_without_llguidance_a_constraint_says_what_to_install(model, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_llguidance(name, *args, **kwargs):
        if name.split(".")[0] == "llguidance":
            raise ImportError("No module named 'llguidance'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_llguidance)
    monkeypatch.setattr(constraint_module, "_grammar_texts", type(constraint_module._grammar_texts)())
    with pytest.raises(GenerationOptionError, match=r"needs llguidance: pip install 'llguidance>=1.0'"):
        model.settings(regex="[a-z]+")
    assert model.settings(max_new_tokens=3).constraint is None  # no constraint, no llguidance needed


def test_the_settings_hold_a_constraint_as_text_and_the_model_refuses_a_bad_one_as_it_enters(model, monkeypatch):
    """GenerationConfig checks a constraint's shape only and never loads llguidance; Model.settings, where a
    request enters, has llguidance read it, before any prompt is tokenized or step run."""
    monkeypatch.setattr(constraint_module, "_grammar_texts", type(constraint_module._grammar_texts)())
    read = []
    real = constraint_module.llguidance
    monkeypatch.setattr(constraint_module, "llguidance", lambda *a: read.append(a) or real(*a))
    config = GenerationConfig(regex="a(")
    assert config.constraint == ("regex", "a(") and read == []
    monkeypatch.setattr(model, "encode", lambda *a, **k: pytest.fail("a prompt was tokenized"))
    with pytest.raises(GenerationOptionError, match="unclosed group") as caught:
        model.generate("Hi", regex="a(")
    assert caught.value.param == "regex" and read


def test_only_the_constraint_module_imports_llguidance():
    import ast
    from pathlib import Path

    runtime = Path(constraint_module.__file__).resolve().parents[1]
    importers = set()
    for path in runtime.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            names += [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            if any(n.split(".")[0] == "llguidance" for n in names):
                importers.add(path.relative_to(runtime).as_posix())
    assert importers == {"sampling/constraint.py"}


def test_a_pydantic_model_class_is_a_schema(model):
    import pydantic

    class Point(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="forbid")  # additionalProperties: false
        x: int = pydantic.Field(ge=0, le=9)
        y: bool

    c = model.generate("Hi", json_schema=Point, max_new_tokens=40)
    assert c.finish_reason == "stop" and Point.model_validate(c.parsed) == Point.model_validate_json(c.text)
    assert model.settings(json_schema=Point).json_schema == json.dumps(Point.model_json_schema())
