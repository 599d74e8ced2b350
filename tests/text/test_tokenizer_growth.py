"""A tokenizer.json is checked by what its pipeline can do to a text's length, whatever its shape: every step kind
has its most growth per UTF-8 byte, Sequences nested at any depth multiply, the normalizer and pre-tokenizer count
together, and a regex anywhere that repeats a repeated group is refused. The bound is checked here against what the
tokenizers library really does, on random pipelines and texts built to hit their patterns."""

import json
import sys
import unicodedata
from pathlib import Path

import pytest
from edgelm.runtime.errors import PackageError, PromptError
from edgelm.runtime.text import tokenizer as tokenizing
from edgelm.runtime.text.tokenizer import MAX_GROWTH, load_tokenizer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

FUZZ = settings(
    max_examples=150, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck)
)
GPT2 = Path(__file__).resolve().parents[2].parent / "shared" / "gpt2-tokenizer" / "tokenizer.json"


def tokenizer_json(normalizer=None, pre_tokenizer=None, decoder=None) -> str:
    """A small WordLevel tokenizer.json with these steps (the steps are what is checked, not the vocabulary)."""
    return json.dumps(
        {
            "version": "1.0",
            "truncation": None,
            "padding": None,
            "added_tokens": [],
            "normalizer": normalizer,
            "pre_tokenizer": pre_tokenizer,
            "post_processor": None,
            "decoder": decoder,
            "model": {"type": "WordLevel", "vocab": {"[UNK]": 0, "a": 1}, "unk_token": "[UNK]"},
        }
    )


def replace(pattern, content, regex=False):
    return {"type": "Replace", "pattern": {"Regex" if regex else "String": pattern}, "content": content}


def seq(*steps, key="normalizers"):
    return {"type": "Sequence", key: list(steps)}


def test_the_unicode_bounds_hold_for_every_code_point():
    """NFD_GROWTH, NFKD_GROWTH and LOWERCASE_GROWTH: the most UTF-8 bytes per byte of one character."""
    most = {"NFD": 0.0, "NFKD": 0.0, "lower": 0.0}
    for code in range(sys.maxunicode + 1):
        if 0xD800 <= code <= 0xDFFF:
            continue
        c = chr(code)
        size = len(c.encode())
        for form in ("NFD", "NFKD"):
            most[form] = max(most[form], len(unicodedata.normalize(form, c).encode()) / size)
        most["lower"] = max(most["lower"], len(c.lower().encode()) / size)
    assert most["NFD"] <= tokenizing.NFD_GROWTH and most["NFKD"] <= tokenizing.NFKD_GROWTH
    assert most["lower"] <= tokenizing.LOWERCASE_GROWTH


@pytest.mark.parametrize(
    "steps, fragment",
    [
        # a Prepend is once per piece between special tokens: 4 KB before a 16-times Replace is 64 KB a piece
        ({"normalizer": seq({"type": "Prepend", "prepend": "x" * 4096}, replace("x", "x" * 16))}, "65,552 times"),
        ({"normalizer": seq(seq(replace("a", "a" * 5)), seq(seq(replace("a", "a" * 5))))}, "25 times"),
        ({"normalizer": seq({"type": "NFKC"}, replace("a", "aa"))}, "22 times"),
        ({"normalizer": replace(" ", "12345678"), "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581"}},
         "pre-tokenizer included"),
        ({"normalizer": seq({"type": "Lowercase"}, replace("(a+)+$", "b", regex=True))}, "repeats a repeated group"),
        ({"decoder": seq(replace("(x*)*", "", regex=True), key="decoders")}, "repeats a repeated group"),
        ({"decoder": seq({"type": "WordPiece", "prefix": "##", "cleanup": True}, replace("a", "a" * 9), key="decoders")},
         "decoder can make a text 18 times"),
    ],
    ids=["prepend-then-replace", "nested-sequences", "nfkc-then-replace", "normalizer-times-pre-tokenizer",
         "normalizer-regex", "decoder-regex", "wordpiece-then-replace"],
)
def test_pipelines_of_other_shapes_are_refused_at_load(steps, fragment):
    with pytest.raises(PackageError, match="is refused") as refused:
        load_tokenizer(tokenizer_json(**steps), "tokenizer.json")
    assert fragment in str(refused.value) and "\n" not in str(refused.value)


def test_a_precompiled_map_counts_its_longest_replacement_and_a_damaged_one_is_one_error():
    import base64

    charsmap = base64.b64encode(b"\0\0\0\0" + b"x" * 40 + b"\0").decode()
    with pytest.raises(PackageError, match="40 times longer"):
        load_tokenizer(tokenizer_json({"type": "Precompiled", "precompiled_charsmap": charsmap}), "tokenizer.json")
    broken = base64.b64encode(b"\xff\xff\0\0ab").decode()  # the library panics building it
    with pytest.raises(PackageError, match="cannot read the tokenizer"):
        load_tokenizer(tokenizer_json({"type": "Precompiled", "precompiled_charsmap": broken}), "tokenizer.json")


@pytest.mark.parametrize(
    "steps",
    [
        {"normalizer": seq({"type": "Prepend", "prepend": "\u2581"}, replace(" ", "\u2581"))},  # Llama 2
        {"pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": False}},
        {  # Qwen2
            "normalizer": {"type": "NFC"},
            "pre_tokenizer": seq(
                {"type": "Split", "pattern": {"Regex": "\\p{L}+|\\p{N}"}, "behavior": "Isolated", "invert": False},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
                key="pretokenizers",
            ),
            "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        },
        {  # BERT
            "normalizer": {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True,
                           "strip_accents": None, "lowercase": True},
            "pre_tokenizer": {"type": "BertPreTokenizer"},
            "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": True},
        },
    ],
    ids=["llama2", "metaspace", "qwen2", "bert"],
)
def test_the_pipelines_of_real_tokenizers_load(steps):
    assert load_tokenizer(tokenizer_json(**steps), "tokenizer.json").encode("Hello there").ids is not None


@pytest.mark.skipif(not GPT2.is_file(), reason="GPT-2's tokenizer.json is in the shared folder")
def test_gpt2s_own_tokenizer_loads():
    assert load_tokenizer(GPT2.read_text(encoding="utf-8"), "tokenizer.json").encode("Hello").ids


ALPHABET = "ab xA\u2581\u0130\ufdfa\u4e2d\u0301"
PIECE = st.text(alphabet=ALPHABET, min_size=0, max_size=4)
LEAVES = st.one_of(
    st.builds(lambda p, c: replace(p, c), st.text(alphabet=ALPHABET, min_size=1, max_size=2), PIECE),
    st.builds(lambda p, c: replace(p, c, regex=True), st.sampled_from(["a", "b+", " ", "[ab]", "x?", ""]), PIECE),
    st.builds(lambda p: {"type": "Prepend", "prepend": p}, PIECE),
    st.sampled_from(
        [{"type": k} for k in ("NFC", "NFD", "NFKC", "NFKD", "Lowercase", "Nmt", "StripAccents", "ByteLevel")]
        + [{"type": "Strip", "strip_left": True, "strip_right": False}]
    ),
)
NORMALIZERS = st.recursive(
    LEAVES, lambda inner: st.lists(inner, min_size=1, max_size=3).map(lambda s: seq(*s)), max_leaves=6
)
PRE_TOKENIZERS = st.one_of(
    st.none(),
    st.sampled_from(
        [
            {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
            {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": True},
            {"type": "Whitespace"},
            {"type": "Split", "pattern": {"String": "a"}, "behavior": "Isolated", "invert": False},
        ]
    ),
)


def _text_bytes(pieces) -> int:
    return sum(len(piece.encode()) for piece, _ in pieces)


@FUZZ
@given(normalizer=NORMALIZERS, pre_tokenizer=PRE_TOKENIZERS, text=st.text(alphabet=ALPHABET, min_size=1, max_size=40))
def test_an_accepted_pipeline_never_grows_a_text_past_its_bound(normalizer, pre_tokenizer, text):
    """Whatever the shape: a pipeline is refused at load, or what it really makes of a text (built from the
    characters its patterns use) is within the growth the check gave it, itself at most MAX_GROWTH."""
    try:
        tokenizer = load_tokenizer(tokenizer_json(normalizer, pre_tokenizer), "tokenizer.json")
    except PackageError:
        return
    try:  # a step the library panics on (an empty Prepend) is a PromptError, as in encode()
        normalized = tokenizing._guarded(lambda: tokenizer.normalizer.normalize_str(text), "normalize")
    except PromptError:
        return
    pieces = tokenizer.pre_tokenizer.pre_tokenize_str(normalized) if tokenizer.pre_tokenizer else [(normalized, 0)]
    bound = tokenizing._growth(normalizer) * tokenizing._growth(pre_tokenizer)  # what the load check allowed
    assert bound <= MAX_GROWTH
    assert _text_bytes(pieces) <= bound * len(text.encode()), (normalizer, pre_tokenizer, text)


@pytest.mark.parametrize("regex, growth", [("x?", 5.0), ("", 5.0), ("a|", 5.0), (r"\b", 5.0), (" {2,}", 3.0), (".", 3.0)])
def test_a_regex_that_may_match_nothing_counts_every_gap(regex, growth):
    """A Replace whose regex matches an empty stretch inserts its content before every character and at the end:
    "A" becomes "AAA" under Replace("x?", "A")."""
    step = {"type": "Replace", "pattern": {"Regex": regex}, "content": "AB"}
    assert tokenizing._growth(step) == growth
