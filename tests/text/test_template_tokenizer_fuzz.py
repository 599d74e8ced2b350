"""Fuzzing of what a package brings besides its graph: chat templates built from Jinja's pieces (filters and
string methods with huge, negative and odd arguments, literals nested in loops, operators, globals) render to
a string within MAX_PROMPT_CHARS or raise ChatError, never anything else; tokenizer.json files with mutated
normalizers, decoders and pre-tokenizers load and run, or are refused with a PackageError, and what they
decode stays within MAX_GROWTH times the token's text; a Rust panic never escapes.

Hypothesis runs derandomized with a bounded number of examples, so every run (and CI) tries the same cases."""

import json
import time

import pytest
from edgelm.runtime.errors import ChatError, DeadlineError, PackageError, PromptError
from edgelm.runtime.text import tokenizer as tokenizing
from edgelm.runtime.text.chat_bounds import MAX_PROMPT_CHARS, deadline
from edgelm.runtime.text.chat_template import ChatTemplate
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

FUZZ = settings(
    max_examples=150, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck)
)
MESSAGES = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hello " * 20}]

NUMBERS = ["0", "1", "-1", "3", "100", "100000", "1000000", "1000000000", "10**9", "-10**9", "2**62"]
VALUES = [
    "'x'",
    "'ab' * 1000",
    "messages",
    "messages[0]",
    "messages[-1].content",
    "ns.v",
    "[ns.v, ns.v]",
    "range(1000)",
    "{'a': ns.v}",
    "(ns.v, ns.v)",
    "lipsum(2)",
    "'%s%s'",
    "'{0}{0}'",
    "'\\t'",
    "1",
    "[1, 2]",
]
FILTERS = [
    "center",
    "indent",
    "replace('a', 'bb')",
    "join",
    "join(ns.v)",
    "format",
    "wordwrap",
    "batch",
    "slice",
    "truncate",
    "tojson",
    "list",
    "string",
    "sum",
    "unique",
    "sort",
    "reverse",
    "upper",
    "trim",
    "length",
    "first",
    "last",
    "default('d')",
    "map('upper')",
    "select",
    "dictsort",
    "items",
    "striptags",
    "urlencode",
    "pprint",
    "urlize",
    "xmlattr",
    "filesizeformat",
    "round",
    "int",
    "abs",
    "title",
    "wordcount",
]
METHODS = [
    "center",
    "ljust",
    "zfill",
    "replace('a', 'bbb')",
    "join",
    "split",
    "strip",
    "format",
    "format_map",
    "startswith('a')",
    "encode",
    "expandtabs",
    "translate",
    "count('a')",
    "upper",
    "splitlines",
]


@st.composite
def expressions(draw, depth=0):
    value = draw(st.sampled_from(VALUES))
    for _ in range(draw(st.integers(0, 3))):
        kind = draw(st.sampled_from(["filter", "filter_n", "method_n", "method", "op"]))
        n = draw(st.sampled_from(NUMBERS))
        if kind == "filter":
            value = f"({value})|{draw(st.sampled_from(FILTERS))}"
        elif kind == "filter_n":
            value = f"({value})|{draw(st.sampled_from(FILTERS)).split('(')[0]}({n})"
        elif kind == "method_n":
            value = f"({value}).{draw(st.sampled_from(METHODS)).split('(')[0]}({n})"
        elif kind == "method":
            value = f"({value}).{draw(st.sampled_from(METHODS))}"
        else:
            other = draw(expressions(depth + 1)) if depth < 2 else draw(st.sampled_from(VALUES))
            value = f"({value}) {draw(st.sampled_from(['*', '+', '~', '%', '**', '==', 'in']))} ({other or n})"
    return value


@st.composite
def templates(draw):
    body = "".join(
        draw(
            st.lists(
                st.one_of(
                    expressions().map(lambda e: f"{{{{ {e} }}}}"),
                    expressions().map(lambda e: f"{{% set ns.v = {e} %}}"),
                    st.tuples(st.sampled_from(["3", "60", "1000", "100000"]), expressions()).map(
                        lambda t: f"{{% for i in range({t[0]}) %}}{{% set ns.v = {t[1]} %}}{{% endfor %}}"
                    ),
                ),
                min_size=1,
                max_size=4,
            )
        )
    )
    return "{% set ns = namespace(v='seed') %}" + body + "{{ ns.v }}"


@settings(FUZZ, max_examples=80)
@given(templates())
def test_fuzzed_chat_templates_render_or_raise_chat_error(source):
    with deadline(time.monotonic() + 60):  # a safeguard: a render this slow fails the test below
        try:
            text = ChatTemplate(source).render(MESSAGES)
        except ChatError as error:
            assert "\n" not in str(error)
            return
        except DeadlineError:
            pytest.fail(f"the template ran a minute: {source}")
    assert isinstance(text, str) and len(text) <= MAX_PROMPT_CHARS


@pytest.fixture(scope="module")
def tokenizer_json(tiny_package):
    return json.loads((tiny_package / "tokenizer.json").read_text())


PATTERNS = [
    {"String": "a"},
    {"String": ""},
    {"String": " "},
    {"Regex": "."},
    {"Regex": "a*"},
    {"Regex": "(a+)+$"},
    {"Regex": "(a|a)+$"},
    {"Regex": "\\s+"},
    {"Regex": "x{2,}"},
    {"Regex": "["},
    {"String": "ab" * 50},
]


@st.composite
def steps(draw, family: str, depth=0):
    if depth < 2 and draw(st.booleans()):
        key = {"normalizer": "normalizers", "decoder": "decoders", "pre_tokenizer": "pretokenizers"}[family]
        return {"type": "Sequence", key: draw(st.lists(steps(family, depth + 1), max_size=4))}
    if family == "pre_tokenizer":
        pattern = draw(st.sampled_from(PATTERNS))
        return {"type": "Split", "pattern": pattern, "behavior": "Isolated", "invert": draw(st.booleans())}
    content = draw(st.sampled_from(["", " ", "b", "\u2581", "x" * 10, "y" * 40, "z" * 400]))
    return {"type": "Replace", "pattern": draw(st.sampled_from(PATTERNS)), "content": content}


TEXTS = ["hello world", "a" * 40 + "b", "aaaa " * 50, "", "\u2581 \t\n", "é中文🙂"]


@FUZZ
@given(st.sampled_from(["normalizer", "decoder", "pre_tokenizer"]).flatmap(lambda f: st.tuples(st.just(f), steps(f))))
def test_fuzzed_tokenizer_files_load_and_run_or_are_refused(tokenizer_json, family_step):
    family, step = family_step
    data = {**tokenizer_json, family: step}
    try:
        tokenizer = tokenizing.load_tokenizer(json.dumps(data), "tokenizer.json")
    except PackageError as error:
        assert "\n" not in str(error)
        return
    longest = max(len(t) for t in tokenizer.get_vocab())
    for text in TEXTS:
        try:
            ids = tokenizing.encode(tokenizer, text).ids
        except PromptError:
            continue
        for token in ids[:20]:
            try:
                piece = tokenizing.decode(tokenizer, [token], skip_special_tokens=False)
            except PromptError:
                continue
            assert len(piece) <= tokenizing.MAX_GROWTH * (longest + 1)
