"""A constraint whose answers must all write a text longer than the model can write (its context of its longest
tokens) is refused before that text is tokenized (runtime/sampling/token_bytes.py, constraint_bounds.py): llguidance
tokenizes what a grammar forces while it builds the grammar, and a 60-character pattern forces megabytes. The
refusal is one line naming the option, whatever kind of constraint forces the text."""

import json

import llguidance  # noqa: F401  (the test extra has it: without it these tests fail, never skip)
import pytest
from edgelm.runtime.errors import GenerationOptionError
from edgelm.runtime.sampling.constraint import Compiler
from edgelm.runtime.sampling.token_bytes import Spelling

CONTEXT = 64  # tokens
LONGEST = 128  # bytes of GPT-2's longest token
BOUND = CONTEXT * LONGEST

TOO_LONG = [
    ("regex", "^(a{100}){100}$"),  # 10,000 bytes
    ("regex", "^((a{100}){100}){100}$"),  # a million: the pattern that stalled the server
    ("json_schema", json.dumps({"const": "x" * (BOUND + 10)})),
    ("json_schema", json.dumps({"type": "string", "pattern": "^(ab){5000}$"})),
    ("grammar", 'start: "%s"' % ("y" * (BOUND + 1))),
    ("choices", ("z" * (BOUND + 1),)),
]


@pytest.fixture()
def told(monkeypatch):
    """The lengths of every text the constraint tokenizer is asked to tokenize."""
    lengths, call = [], Spelling._text
    monkeypatch.setattr(Spelling, "_text", lambda self, data: lengths.append(len(data)) or call(self, data))
    return lengths


@pytest.fixture(scope="module")
def compiler(gpt2_tokenizer_dir):
    return Compiler((gpt2_tokenizer_dir / "tokenizer.json").read_text(), 50257, (50256,), max_tokens=CONTEXT)


@pytest.mark.parametrize("kind, value", TOO_LONG, ids=[f"{k}:{str(v)[:24]}" for k, v in TOO_LONG])
def test_a_forced_text_longer_than_the_context_can_hold_is_refused_unread(compiler, told, kind, value):
    with pytest.raises(GenerationOptionError, match=f"the {kind} constraint forces a text of .* bytes") as refused:
        compiler.compile(kind, value)
    assert refused.value.param == kind
    assert f"more than this model can write within its context (at most {BOUND:,})" in str(refused.value)
    assert "\n" not in str(refused.value) and "edgelm-text-too-long" not in str(refused.value)
    assert max(told, default=0) <= BOUND  # nothing longer was tokenized


def test_a_forced_text_the_context_can_hold_compiles(compiler, told):
    grammar = compiler.compile("regex", "^(a{100}){50}$")  # 5,000 bytes
    assert grammar.forced > 0 and max(told) == 5_000
    with pytest.raises(GenerationOptionError, match="max_new_tokens=16"):  # the answer's own budget still counts
        compiler.compile("regex", "^(a{100}){50}$", max_new_tokens=16)


def test_without_a_context_nothing_is_refused_for_its_length(gpt2_tokenizer_dir):
    unbounded = Compiler((gpt2_tokenizer_dir / "tokenizer.json").read_text(), 50257, (50256,))
    assert unbounded.compile("regex", "^(a{100}){100}$").forced > CONTEXT


def test_a_models_constraint_is_bounded_by_its_own_context(model):
    """The tiny package's context is 64 tokens: a regex forcing 5,000 bytes cannot be written in it."""
    with pytest.raises(GenerationOptionError, match="regex constraint forces a text of 5,000 bytes") as refused:
        model.compile_constraint(model.settings(regex="b{5000}"))
    assert refused.value.param == "regex"


def test_a_text_too_long_is_answered_with_no_tokens_and_noted_for_its_thread(compiler):
    """No exception crosses into llguidance (a panic there keeps its backtrace's ~30 MB for good): the text gets no
    tokens, and the refusal is noted for the thread that asked, once."""
    import threading

    spelling = compiler._tokenizer()[1]
    assert spelling(b"a" * (BOUND + 1)) == []
    elsewhere = []
    thread = threading.Thread(target=lambda: elsewhere.append(spelling.take_refused()))
    thread.start()
    thread.join()
    assert elsewhere == [None]
    assert spelling.take_refused() == (BOUND + 1, BOUND)
    assert spelling.take_refused() is None
    assert spelling(b"a" * BOUND) and spelling.take_refused() is None
