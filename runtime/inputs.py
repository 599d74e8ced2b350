"""What a caller sends that is not a generation option, each checked by one function here: token ids against the
vocabulary, text that must be Unicode, bytes that must be UTF-8.

The Python API, the command line, prompt files and the server all call these and turn a refusal into their own
form (PromptError in the API, a click error in the CLI, a 400 in the server), so each rule and its wording is
written once. Generation options (their token ids included) are checked by GenerationConfig.
"""

from numbers import Integral

from .errors import PromptError

TEXT_HINT = "(text read as UTF-8 that was not, or a broken escape); send UTF-8 text"


def is_token_id(value, vocab_size: int | None = None) -> bool:
    """Whether `value` is an integer (not a bool) in [0, vocab_size), or >= 0 with no vocabulary given."""
    return (
        isinstance(value, Integral)
        and not isinstance(value, bool)
        and value >= 0
        and (vocab_size is None or value < vocab_size)
    )


def check_token_ids(ids, vocab_size: int, where: str | None = None) -> None:
    """Raise PromptError naming the first of `ids` that is not a token id of a vocabulary of vocab_size entries,
    and where it is (`where`[position]) when `where` is given."""
    plain = isinstance(ids, (list, tuple)) and len(ids) > 0 and set(map(type, ids)) == {int}
    if plain and 0 <= min(ids) and max(ids) < vocab_size:
        return  # plain ints in range, checked in C: the walk below, a Python call per id, costs ~0.7 us an id
    for at, token in enumerate(ids):
        if not is_token_id(token, vocab_size):
            span = f"(0..{vocab_size - 1})"
            shown = repr(token)[:40]
            raise PromptError(
                f"token id {shown} is outside the vocabulary {span}"
                if where is None
                else f"{where}[{at}] is the token id {shown}, outside the vocabulary {span}"
            )


def text_problem(value, where: str) -> str | None:
    """What keeps `value` (a string, or lists and objects of them, as JSON gives) from being Unicode text, in one
    line naming the place (`where`, then [i] and .key); None when it is text. JSON and Python strings can hold a
    lone UTF-16 surrogate ("\\ud800"), which is no character: Python's stand-in for bytes that were not UTF-8.
    The walk keeps its own stack, so a value nested as deep as JSON allows is read, never a RecursionError."""
    todo = [(value, where)]  # depth first, in order: the first problem found is the first in the value
    while todo:
        item, place = todo.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError as error:
                code = ord(item[error.start])
                return (
                    f"{place} is not Unicode text: it has a lone surrogate \\u{code:04x} at character {error.start} "
                    f"{TEXT_HINT}"
                )
        elif isinstance(item, (list, tuple)):
            todo.extend(reversed([(inner, f"{place}[{i}]") for i, inner in enumerate(item)]))
        elif isinstance(item, dict):
            for key in item:
                if isinstance(key, str) and not _encodes(key):
                    return f"a field name in {place} is not Unicode text: it has a lone surrogate {TEXT_HINT}"
            todo.extend(reversed([(inner, f"{place}.{key}") for key, inner in item.items()]))
    return None


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_text(text: str, where: str = "the text") -> str:
    """`text` itself; PromptError (text_problem's line) when it is not Unicode text."""
    problem = text_problem(text, where)
    if problem:
        raise PromptError(problem)
    return text


def decode_utf8(data: bytes, where: str) -> str:
    """`data` decoded as UTF-8; PromptError naming `where`, the first bad byte and its offset, when it is not."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise PromptError(
            f"{where} is not valid UTF-8 (byte 0x{data[error.start]:02x} at offset {error.start}); convert it first, "
            "e.g. iconv -t UTF-8."
        ) from None
