"""The package's tokenizer.json, which is hostile input like the rest of the package: checked before it is
built, and run so that its failures are edgelm errors.

At load (`load_tokenizer`), refused with the reason:
- a normalizer or decoder chain of `Replace` steps that can grow text more than MAX_GROWTH times (each step
  may multiply: "a" -> 50 "a"s three times makes one token 125,000 characters, and such chains reach GB);
- a split regex with a quantified group that itself holds a quantifier (`(a+)+`), whose backtracking makes the
  regex engine give up on ordinary text.
In use (`encode`, `decode`), a panic inside the Rust library (a PanicException, a BaseException that would
pass every `except Exception`) becomes a PromptError, and both run with the GIL released (the batch calls),
so a long text does not stop the other threads, the server's event loop among them."""

import json
import re

from ..errors import GenerationOptionError, PackageError, PromptError
from ..inputs import text_problem

MAX_BANNED = 64  # words one request may ban: each is looked for at the end of every row at every step
MAX_BANNED_CHARS = 4096  # all of them together
MAX_GROWTH = 16  # how many times a normalizer or decoder chain may lengthen a text; real ones: 1 ("▁" <-> " ")
_NESTED_QUANTIFIER = re.compile(r"\((?:[^()\\]|\\.)*(?:[+*]|\{\d+,\d*\})(?:[^()\\]|\\.)*\)(?:[+*]|\{\d+,\d*\})")


def load_tokenizer(text: str, where: str):
    """A tokenizers.Tokenizer from tokenizer.json's text; PackageError naming `where` if it is refused.

    The checks read the built tokenizer's steps back as JSON (each step's __getstate__, the file's own shape)
    rather than parsing the whole file in Python: tokenizer.json is mostly vocabulary and merges, and a second
    parse of them cost more than a tenth of a second of every load (benchmarks/results/2026-12-02-start-to-first-
    token.md). Building runs nothing of the file's: a step does its work only when a text is encoded or decoded."""
    from tokenizers import Tokenizer

    try:
        tokenizer = Tokenizer.from_str(text)
    except Exception as error:  # tokenizers raises a bare Exception for a damaged file
        raise PackageError(f"cannot read the tokenizer {where}: {str(error)[:200]}") from None
    for part in ("normalizer", "decoder"):
        growth = _growth(_step(tokenizer, part))
        if growth > MAX_GROWTH:
            raise PackageError(
                f"the tokenizer {where} is refused: its {part} can make a text {growth:,.0f} times longer "
                f"(Replace steps; at most {MAX_GROWTH} is allowed), so one token could decode to gigabytes"
            )
    for pattern in _split_patterns(_step(tokenizer, "pre_tokenizer")):
        if _NESTED_QUANTIFIER.search(pattern):
            raise PackageError(
                f"the tokenizer {where} is refused: its pre-tokenizer regex {pattern[:80]!r} repeats a repeated "
                "group, which backtracks without end on ordinary text"
            )
    return tokenizer


def _step(tokenizer, part: str):
    """The tokenizer's `part` ("normalizer", "decoder", "pre_tokenizer") as tokenizer.json writes it; None without."""
    step = getattr(tokenizer, part, None)
    return None if step is None else json.loads(step.__getstate__())


def encode(tokenizer, text: str, add_special_tokens: bool = True):
    """tokenizer.encode(text), with the GIL released; a panic in the tokenizer is a PromptError."""
    if not hasattr(tokenizer, "encode_batch"):  # a stand-in with encode() only
        return _guarded(lambda: tokenizer.encode(text, add_special_tokens=add_special_tokens), "encode")
    return _guarded(lambda: tokenizer.encode_batch([text], add_special_tokens=add_special_tokens)[0], "encode")


def banned_ids(tokenizer, words) -> tuple:
    """The token-id sequences that write `words` (the ban option, a word or a list of them), for bad_words_ids:
    each word as the tokenizer writes it, and after a space (how a word within a sentence is written) unless it
    starts with one. GenerationOptionError(param="ban") for anything but non-empty texts within the bounds."""
    words = (words,) if isinstance(words, str) else words
    if not (isinstance(words, (list, tuple)) and all(isinstance(w, str) and w for w in words)):
        raise GenerationOptionError(
            f'ban must be a list of non-empty strings, e.g. ["darn", "heck"], got {str(words)[:80]}', param="ban"
        )
    if len(words) > MAX_BANNED or sum(map(len, words)) > MAX_BANNED_CHARS:
        raise GenerationOptionError(
            f"ban lists {len(words)} words of {sum(map(len, words))} characters; at most {MAX_BANNED} words and "
            f"{MAX_BANNED_CHARS} characters are allowed",
            param="ban",
        )
    problem = next(filter(None, (text_problem(w, "ban") for w in words)), None)
    if problem:
        raise GenerationOptionError(problem, param="ban")
    texts = [*words, *(" " + w for w in words if not w.startswith(" "))]
    return tuple(tuple(encode(tokenizer, text, add_special_tokens=False).ids) for text in texts)


def decode(tokenizer, ids, skip_special_tokens: bool = True) -> str:
    """tokenizer.decode(ids), with the GIL released; a panic in the tokenizer is a PromptError."""
    if not hasattr(tokenizer, "decode_batch"):  # a stand-in with decode() only
        return _guarded(lambda: tokenizer.decode(ids, skip_special_tokens=skip_special_tokens), "decode")
    return _guarded(lambda: tokenizer.decode_batch([ids], skip_special_tokens=skip_special_tokens)[0], "decode")


def _guarded(call, what: str):
    try:
        return call()
    except Exception:
        raise
    except BaseException as error:  # pyo3's PanicException: the Rust library gave up
        if type(error).__name__ != "PanicException":
            raise
        reason = " ".join(str(error).split())[:200]
        raise PromptError(f"the package's tokenizer failed to {what} this text ({reason})") from None


def _growth(step) -> float:
    """How many times longer `step` (a normalizer or decoder, nested in Sequences) can make a text."""
    if not isinstance(step, dict):
        return 1.0
    kind = step.get("type")
    if kind == "Sequence":
        growth = 1.0
        for inner in step.get("normalizers") or step.get("decoders") or []:
            growth *= _growth(inner)
        return growth
    if kind != "Replace":
        return 1.0
    pattern, content = step.get("pattern"), step.get("content")
    content = len(content) if isinstance(content, str) else 0
    if isinstance(pattern, dict) and isinstance(pattern.get("String"), str) and pattern["String"]:
        return max(1.0, content / len(pattern["String"]))
    return float(content + 1)  # a regex may match one character, or nothing between every two


def _split_patterns(step) -> list:
    """The regexes of Split pre-tokenizers in `step` (nested in Sequences)."""
    if not isinstance(step, dict):
        return []
    if step.get("type") == "Sequence":
        return [p for inner in step.get("pretokenizers") or [] for p in _split_patterns(inner)]
    pattern = step.get("pattern")
    if step.get("type") == "Split" and isinstance(pattern, dict) and isinstance(pattern.get("Regex"), str):
        return [pattern["Regex"]]
    return []
