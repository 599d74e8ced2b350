"""The constraint engine knows every token of the tokenizers real families ship (tests/support/tokenizer_layouts.py:
Qwen2.5's, Llama 3.2's, SmolLM2's and TinyLlama's, on small vocabularies) with the bytes it spells: added tokens
that are text (Qwen2.5's `<tool_call>`), special ones, byte fallback, merges, and ids past the tokenizer.

The walks below are what a model that writes its family's text would do: the answer, tokenized by the package's
own tokenizer, goes through a constraint one token at a time, each token allowed by the mask before it and
accepted after it, and the answer may end where it is complete. Every schema kind, regex, grammar, choices and
every tool format is walked on every layout."""

import json

import llguidance  # noqa: F401  (the test extra has it: without it these tests fail, never skip)
import numpy as np
import pytest
from edgelm.runtime.errors import GenerationOptionError
from edgelm.runtime.sampling.constraint import Compiler, Masks, grammar_text, schema_text
from edgelm.runtime.text.tools import FORMATS
from tokenizer_layouts import LAYOUTS, build_layout, eos_ids, layout_text, logits_size
from tokenizers import Tokenizer
from transformers.models.gpt2.tokenization_gpt2 import bytes_to_unicode
from weather_tools import WEATHER_CLOSED_DAYS

CLOCK = {"type": "function", "function": {"name": "now"}}
# (kind, constraint, an answer it accepts)
ANSWERS = [
    ("json_schema", {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
     '{"name":"Émile <a> \\n"}'),
    ("json_schema", {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99}}, "[1,22,3]"),
    ("json_schema", {"enum": ["red", "green", "<tool_call>"]}, '"<tool_call>"'),
    ("json_object", True, '{"a":[true,null,1.5]}'),
    ("regex", r"[A-Z]{2}-\d{3} <tool_call>", "AB-123 <tool_call>"),
    ("grammar", 'start: "<tool_call>" NAME "</tool_call>"\nNAME: /[a-z_]+/', "<tool_call>get_weather</tool_call>"),
    ("choices", ("yes", "no", "<|fim_prefix|>", "Zürich"), "Zürich"),
    ("choices", ("yes", "no", "<|fim_prefix|>", "Zürich"), "<|fim_prefix|>"),
]


@pytest.fixture(scope="module", params=sorted(LAYOUTS))
def layout(request, tmp_path_factory):
    name = request.param
    folder = build_layout(tmp_path_factory.mktemp(name), name)
    text = layout_text(folder)
    tokenizer = Tokenizer.from_str(text)  # the package's, as the model hands it to the compiler
    return name, tokenizer, Compiler(text, logits_size(folder, name), eos_ids(folder, name), encoder=tokenizer)


def _spelled(name: str, token: str) -> bytes:
    """The bytes a vocabulary token stands for in the layout's own terms."""
    if name == "tinyllama":
        if token.startswith("<0x") and len(token) == 6:
            return bytes([int(token[3:5], 16)])
        return token.replace("▁", " ").encode()
    decoder = {c: b for b, c in bytes_to_unicode().items()}
    return bytes(decoder[c] for c in token)


def test_every_id_has_the_bytes_it_spells(layout):
    name, tokenizer, compiler = layout
    engine = compiler.tokenizer()
    data = json.loads(compiler.tokenizer_json)
    added = {t["id"]: t for t in data["added_tokens"]}
    for token, i in data["model"]["vocab"].items():
        if i not in added and b"\xff" in _spelled(name, token):  # never in UTF-8 text; llguidance's own marker
            assert engine.decode_bytes([i]) == b""  # so never allowed
        elif i not in added:
            assert engine.decode_bytes([i]) == _spelled(name, token), (i, token)
            assert not engine.is_special_token(i)
    for i, entry in added.items():
        assert engine.is_special_token(i) == entry["special"], entry
        assert engine.decode_bytes([i]) == entry["content"].encode()
    for i in range(tokenizer.get_vocab_size(), compiler.vocab_size):  # logits past the tokenizer: never text
        assert engine.is_special_token(i)
    assert set(engine.eos_tokens) == set(compiler.eos_ids)


def _walk(compiler, tokenizer, kind, value, answer: str) -> None:
    """The answer's tokens (as the package's tokenizer writes them) go through the constraint one at a time."""
    ids = _written(tokenizer, answer)
    row = compiler.compile(kind, value).row()
    masks = Masks(1, compiler.vocab_size)
    for token in ids:
        masks.start([row])
        keep, listed = masks.wait().rows[0]
        assert (token in listed) == keep, f"{tokenizer.id_to_token(token)!r} is masked in {answer!r}"
        row.advance(token)  # raises GenerationOptionError where the matcher refuses it
    assert row.may_end, answer
    masks.start([row])
    keep, listed = masks.wait().rows[0]
    assert any((e in listed) == keep for e in compiler.eos_ids)  # the answer may end here


def _written(tokenizer, answer: str) -> list:
    """The ids of `answer` as the model writes it after a prompt's last line (SentencePiece puts a space in front of
    a text, not in front of an answer)."""
    line = tokenizer.encode("\n", add_special_tokens=False).ids
    ids = tokenizer.encode("\n" + answer, add_special_tokens=False).ids
    assert ids[: len(line)] == line
    return ids[len(line) :]


@pytest.mark.parametrize("kind, value, answer", ANSWERS, ids=[f"{a[0]}:{a[2][:14]}" for a in ANSWERS])
def test_schemas_regexes_grammars_and_choices_walk_on_every_layout(layout, kind, value, answer):
    _, tokenizer, compiler = layout
    value = schema_text(value) if kind == "json_schema" else value
    _walk(compiler, tokenizer, kind, value, answer)


@pytest.mark.parametrize("fmt", sorted(FORMATS))
@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_forced_calls_walk_in_every_format_on_every_layout(layout, fmt, choice):
    """Qwen2.5's `<tool_call>` is one added token that is text: the forced wrapper is written with it."""
    _, tokenizer, compiler = layout
    form = FORMATS[fmt]
    kind, grammar = form.constraint([WEATHER_CLOSED_DAYS, CLOCK], choice)
    calls = [("get_weather", {"city": "Zürich", "days": 3})]
    if form.parallel and choice == "required":
        calls.append(("now", {}))
    _walk(compiler, tokenizer, kind, grammar, form.call_text(calls))


def test_the_forced_wrapper_is_the_added_token(layout):
    """Where the tokenizer has `<tool_call>` as one token, the call's forced start is that token, as the model was
    trained to write it."""
    name, tokenizer, compiler = layout
    _, grammar = FORMATS["hermes"].constraint([WEATHER_CLOSED_DAYS], "required")
    forced = compiler.compile("grammar", grammar).row().matcher.compute_ff_tokens()
    single = tokenizer.token_to_id("<tool_call>")
    assert (forced[:1] == [single]) == (name == "qwen2.5")
    if name != "qwen2.5":
        assert compiler.tokenizer().decode_bytes(forced).startswith(b"<tool_call>")


def test_masks_of_several_rows_at_once(layout):
    """The batch path (llguidance's threads) on the layout's tokenizer: each row gets its own constraint's mask."""
    _, tokenizer, compiler = layout
    _, grammar = FORMATS["hermes"].constraint([WEATHER_CLOSED_DAYS], "required")
    rows = [compiler.compile("grammar", grammar).row(), compiler.compile("choices", ("no", "yes")).row(), None]
    masks = Masks(3, compiler.vocab_size)
    masks.start(rows)
    allowed = masks.wait().rows
    first = _written(tokenizer, "<tool_call>\n")[0]
    assert allowed[0][0] and first in allowed[0][1]
    assert allowed[1][0] and _written(tokenizer, "no")[0] in allowed[1][1]
    assert not allowed[2][0] and allowed[2][1].size == 0


@pytest.mark.parametrize(
    "kind, value",
    [
        ("json_schema", '{"const": "TEXT"}'),
        ("json_schema", '{"type": "object", "properties": {"a": {"const": "TEXT"}}, "required": ["a"]}'),
        ("regex", "TEXT"),
        ("grammar", 'start: "TEXT"'),
        ("choices", ("fine", "TEXT")),
    ],
)
def test_an_output_that_must_hold_a_special_tokens_text_is_refused_before_generation(layout, kind, value):
    """A reply that holds a special token's text reads, sent back in a conversation, as that token (the end of a
    turn, a new role): a constraint that forces one is refused when it is compiled, naming the option."""
    name, _, compiler = layout
    special = {"qwen2.5": "<|im_end|>", "llama3.2": "<|eot_id|>", "smollm2": "<|endoftext|>", "tinyllama": "</s>"}
    text = special[name]
    if kind == "regex":
        value = "".join("\\" + c if c in "|.()[]{}*+?^$\\" else c for c in text)
    elif kind == "choices":
        value = tuple(v.replace("TEXT", text) for v in value)
    else:
        value = value.replace("TEXT", text)
    grammar_text(kind, value)  # the option alone is fine: it is the tokenizer that makes the text special
    with pytest.raises(GenerationOptionError, match=f"{kind}.*special token") as caught:
        compiler.compile(kind, value)
    assert caught.value.param == kind and "\n" not in str(caught.value) and text in str(caught.value)


def test_a_special_tokens_text_the_answer_may_hold_is_written_as_text(layout):
    """Not forced, a special token's text inside a string is spelled with text tokens, never the special one."""
    name, tokenizer, compiler = layout
    text = {"qwen2.5": "<|im_end|>", "llama3.2": "<|eot_id|>", "smollm2": "<|endoftext|>", "tinyllama": "</s>"}[name]
    row = compiler.compile("json_schema", schema_text({"type": "string", "maxLength": 40})).row()
    masks = Masks(1, compiler.vocab_size)
    masks.start([row])
    keep, listed = masks.wait().rows[0]
    special = tokenizer.token_to_id(text)
    assert (special in listed) != keep  # the special token is never text
    row.advance(_written(tokenizer, '"')[0])
    for token in compiler.tokenizer().tokenize_str(text):
        assert not compiler.tokenizer().is_special_token(token)
        row.advance(token)
    assert not np.any(np.isin(compiler.tokenizer().tokenize_str(text), [special]))


class _ReadsNothing:
    """llguidance's own reading of the tokenizer, with its tokenizing (which holds the GIL) taken away."""

    def __init__(self, read):
        self.greedy_tokenize = read.greedy_tokenize

    def tokenize_bytes(self, data):
        raise AssertionError(f"tokenized holding the GIL: {data[:40]!r}")


def test_a_forced_text_is_tokenized_as_llguidance_reads_it_with_the_gil_released(layout):
    """llguidance tokenizes what a grammar forces through Spelling. Where the tokenizers library reads a text alone
    as llguidance does (byte-level families), Spelling tokenizes with it, the GIL released; SentencePiece's space
    marker in front (TinyLlama) keeps llguidance's own reading. Either way the ids are llguidance's own."""
    name, _, compiler = layout
    spelling = compiler._tokenizer()[1]
    read = spelling._read
    rng = np.random.default_rng(0)
    alphabet = list("ab c\nÉ日🙂<>|_{}\":0123 tool_call/") + ["<tool_call>", "</tool_call>", "<|fim_prefix|>"]
    texts = ["hello world", " hello", "a" * 3000, "Émile <a> \n", "  spaces  ", "🙂ok"]
    texts += ["".join(rng.choice(alphabet, rng.integers(1, 30))) for _ in range(200)]
    texts = [t for t in texts if not any(s in t for s in spelling.special_texts)]
    for text in texts:
        assert spelling(text.encode()) == read.tokenize_bytes(text.encode()), text
    assert (spelling._encode is None) == (name == "tinyllama")
    # without the package's tokenizer the sampling layer builds none of its own: llguidance's reading
    assert Compiler(compiler.tokenizer_json, compiler.vocab_size, ())._tokenizer()[1]._encode is None
    if spelling._encode is not None:
        spelling._read = _ReadsNothing(read)
        try:
            assert spelling(("Hello world, <tool_call> " * 2000).encode())
        finally:
            spelling._read = read
