"""The package's tokenizer.json, which is hostile input like the rest of the package: checked before it is
built, and run so that its failures are edgelm errors.

At load (`load_tokenizer`), refused with the reason, whatever the shape of the pipeline (steps nested in
Sequences at any depth, in any order):
- a pipeline that can make a text more than MAX_GROWTH times longer, in UTF-8 bytes: the normalizer and the
  pre-tokenizer together (what encoding holds), or the decoder. Every step kind the tokenizers library has is
  given its most growth per byte (`_growth`: a Replace's content over its pattern, a Prepend's text once per
  piece, Unicode normalization's most per character, a Precompiled map's longest replacement, ...), a Sequence
  multiplies its steps', and a kind not known here is refused: "a" -> 50 "a"s three times makes one token 125,000
  characters, a Prepend of 4 KB before a Replace makes each piece between two special tokens 64 KB, and such
  chains reach the gigabytes at which the Rust library aborts the process;
- a regex anywhere in the pipeline (a Split, a Replace) with a quantified group that itself holds a quantifier
  (`(a+)+`), whose backtracking makes the regex engine give up on ordinary text, or take its time doing so;
- a file whose building panics in the Rust library (a damaged Precompiled map).
In use (`encode`, `decode`), a panic inside the Rust library (a PanicException, a BaseException that would
pass every `except Exception`) becomes a PromptError, and both run with the GIL released (the batch calls),
so a long text does not stop the other threads, the server's event loop among them."""

import base64
import json
import math
import re

from ..errors import GenerationOptionError, PackageError, PromptError
from ..inputs import text_problem

MAX_BANNED = 64  # words one request may ban: each is looked for at the end of every row at every step
MAX_BANNED_CHARS = 4096  # all of them together
MAX_GROWTH = 16  # how many times encoding's steps, or decoding's, may lengthen a text in UTF-8 bytes; Llama 2's: 12
# The most UTF-8 bytes one character's normalization (or lowercasing) gives per byte of it, over every code point
# (Python's unicodedata; tests/text/test_tokenizer_growth.py recomputes them): U+FDFA's 3 bytes become 33 under NFKD.
NFD_GROWTH, NFKD_GROWTH, LOWERCASE_GROWTH = 3.0, 11.0, 1.5
SPLITS = ("Split", "Whitespace", "WhitespaceSplit", "BertPreTokenizer", "Punctuation", "Digits", "UnicodeScripts")
SPLITS += ("CharDelimiterSplit", "FixedLength")  # pre-tokenizers that only cut a text (or drop from it)
SHRINKS = ("Strip", "StripAccents", "Nmt", "ByteFallback", "Fuse")  # steps that never lengthen a text


class Unbounded(ValueError):
    """A step whose growth cannot be bounded: a kind not known here, or a Precompiled map that cannot be read."""
_NESTED_QUANTIFIER = re.compile(r"\((?:[^()\\]|\\.)*(?:[+*]|\{\d+,\d*\})(?:[^()\\]|\\.)*\)(?:[+*]|\{\d+,\d*\})")


def load_tokenizer(text: bytes | str, where: str):
    """A tokenizers.Tokenizer from tokenizer.json's bytes (or its text); PackageError naming `where` if it is refused.
    From bytes, the tokenizers library checks the UTF-8 as it parses: no decode to a Python str first, and no
    encode back to UTF-8 on the way in (for GPT-2's 3.5 MB, each a few milliseconds of a start).

    The checks read the built tokenizer's steps back as JSON (each step's __getstate__, the file's own shape)
    rather than parsing the whole file in Python: tokenizer.json is mostly vocabulary and merges, and a second
    parse of them cost more than a tenth of a second of every load (benchmarks/results/2026-12-02-start-to-first-
    token.md). Building runs nothing of the file's: a step does its work only when a text is encoded or decoded."""
    from tokenizers import Tokenizer

    try:
        tokenizer = Tokenizer.from_buffer(text) if isinstance(text, bytes) else Tokenizer.from_str(text)
    except Exception as error:  # tokenizers raises a bare Exception for a damaged file
        raise PackageError(f"cannot read the tokenizer {where}: {str(error)[:200]}") from None
    except BaseException as error:  # a PanicException: building it ran a step that gave up (a damaged map)
        if type(error).__name__ != "PanicException":
            raise
        reason = " ".join(str(error).split())[:200]
        raise PackageError(f"cannot read the tokenizer {where}: the tokenizers library failed ({reason})") from None
    try:
        steps = {part: _step(tokenizer, part) for part in ("normalizer", "pre_tokenizer", "decoder")}
        encoding = _growth(steps["normalizer"]) * _growth(steps["pre_tokenizer"])
        for part, growth in (("normalizer", encoding), ("decoder", _growth(steps["decoder"]))):
            if growth > MAX_GROWTH:
                with_split = ", its pre-tokenizer included" if part == "normalizer" else ""
                raise PackageError(
                    f"the tokenizer {where} is refused: its {part} can make a text {growth:,.0f} times longer"
                    f"{with_split} (at most {MAX_GROWTH} is allowed), so one text or token could grow to gigabytes"
                )
        patterns = [p for step in steps.values() for p in _regexes(step)]
    except Unbounded as error:
        raise PackageError(f"the tokenizer {where} is refused: {error}") from None
    except RecursionError:
        raise PackageError(f"the tokenizer {where} is refused: its steps are nested too deeply") from None
    for pattern in patterns:
        if _NESTED_QUANTIFIER.search(pattern):
            raise PackageError(
                f"the tokenizer {where} is refused: its regex {pattern[:80]!r} repeats a repeated group, which "
                "backtracks without end on ordinary text"
            )
    return tokenizer


def _step(tokenizer, part: str):
    """The tokenizer's `part` ("normalizer", "decoder", "pre_tokenizer") as tokenizer.json writes it; None without."""
    step = getattr(tokenizer, part, None)
    return None if step is None else json.loads(step.__getstate__())


def encode(tokenizer, text: str, add_special_tokens: bool = True):
    """tokenizer.encode(text)'s ids (its tokens and offsets left empty), with the GIL released; a panic in the
    tokenizer is a PromptError. Every caller reads the ids only: computing offsets makes encoding several times
    slower, and an Encoding that holds them and its tokens' texts is freed with the GIL held, which stalls the other
    threads (the server's event loop) after a long text."""
    if not hasattr(tokenizer, "encode_batch"):  # a stand-in with encode() only
        return _guarded(lambda: tokenizer.encode(text, add_special_tokens=add_special_tokens), "encode")
    batch = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)  # tokenizers >= 0.20
    return _guarded(lambda: batch([text], add_special_tokens=add_special_tokens)[0], "encode")


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
    """The most times longer, in UTF-8 bytes, that `step` (a normalizer, pre-tokenizer or decoder as tokenizer.json
    writes it, Sequences nested at any depth) can make any text; Unbounded for a step it cannot bound."""
    if step is None:
        return 1.0
    kind = step.get("type") if isinstance(step, dict) else None
    if kind == "Sequence":
        inner = step.get("normalizers") or step.get("pretokenizers") or step.get("decoders") or []
        return math.prod(_growth(s) for s in inner)
    if kind == "Replace":
        pattern, content = step.get("pattern") or {}, _bytes(step.get("content"))
        literal = pattern.get("String") if isinstance(pattern, dict) else None
        if isinstance(literal, str) and literal:
            return max(1.0, content / _bytes(literal))  # each match, of the pattern's length, becomes the content
        regex = pattern.get("Regex") if isinstance(pattern, dict) else None
        if isinstance(regex, str) and _may_match_nothing(regex):
            # it may match nothing before each character and at the end: n + (n + 1) * content bytes out of n
            return float(2 * content + 1)
        return float(content + 1)  # each match is at least one byte
    if kind == "Prepend":
        return 1.0 + _bytes(step.get("prepend"))  # once per piece, and a piece may be one byte
    if kind in ("NFC", "NFD"):
        return NFD_GROWTH
    if kind in ("NFKC", "NFKD"):
        return NFKD_GROWTH
    if kind == "Lowercase":
        return LOWERCASE_GROWTH
    if kind == "BertNormalizer":  # spaces around each CJK character (3 bytes -> 5), accents split off, lowercased
        return 5 / 3 * NFD_GROWTH * LOWERCASE_GROWTH
    if kind == "ByteLevel":  # each byte becomes a character of at most 2 bytes, and a space may lead each piece
        return 2.0 + bool(step.get("add_prefix_space"))
    if kind == "Metaspace":  # spaces become the replacement, which may also lead each piece
        return 2.0 * max(1, _bytes(step.get("replacement")))
    if kind in ("WordPiece", "BPEDecoder", "CTC"):  # a space between tokens, or for a marker that may be empty
        return 2.0
    if kind == "Precompiled":
        return _precompiled_growth(step.get("precompiled_charsmap"))
    if kind in SPLITS or kind in SHRINKS:
        return 1.0
    raise Unbounded(f"it has a step of a kind edgelm cannot bound ({str(kind)[:40]!r}); export it with a known one")


def _bytes(text) -> int:
    return len(text.encode("utf-8", "surrogatepass")) if isinstance(text, str) else 0


def _precompiled_growth(charsmap) -> float:
    """A SentencePiece map's most growth: its longest replacement (a match is at least one byte). The map is
    4 bytes of trie size, the trie, then the replacements, each ended by a NUL byte."""
    if charsmap is None or charsmap == "" or charsmap == []:
        return 1.0
    try:
        data = bytes(charsmap) if isinstance(charsmap, list) else base64.b64decode(charsmap, validate=True)
        size = int.from_bytes(data[:4], "little")
        if len(data) < 4 or 4 + size > len(data):
            raise ValueError("its trie runs past its end")
    except (ValueError, TypeError) as error:
        raise Unbounded(f"its Precompiled normalizer map cannot be read ({error})") from None
    return float(max(1, *(len(piece) for piece in data[4 + size :].split(b"\0"))))


def _may_match_nothing(regex: str) -> bool:
    """Whether a Replace's regex may match an empty stretch somewhere, read from its text: an optional or starred
    part, a zero count, an assertion or an empty alternative may. Groups `(?:`, inline flags and lazy quantifiers
    are not such operators; a `?` or `*` anywhere else counts, so the answer errs towards "may"."""
    assertion = re.search(r"\\[bBAzZG]", regex)
    plain = re.sub(r"\\.", "x", regex)  # an escaped character is one character
    plain = re.sub(r"\(\?(?:[a-zA-Z-]*:|[a-zA-Z-]+\))", "(", plain)  # groups (?: and inline flags
    plain = re.sub(r"([+}])\?", r"\1", plain)  # lazy quantifiers
    return bool(assertion or re.search(r"^$|\(\)|[?*^$]|\{0|\(\||\|\)|\|\||^\||\|$", plain))


def _regexes(step) -> list:
    """Every regex in `step`, at any depth (a Split's, a Replace's)."""
    if isinstance(step, dict):
        own = [step["Regex"]] if isinstance(step.get("Regex"), str) else []
        return own + [p for value in step.values() for p in _regexes(value)]
    if isinstance(step, list):
        return [p for value in step for p in _regexes(value)]
    return []
