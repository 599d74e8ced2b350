"""The text a package's quality is measured on: read from a file with bounds, identified by name and sha256, and
cut to the first `eval_tokens` tokens of the model's tokenizer.

The export measures on export/data/'s sample unless given another (`edgelm export --eval-text`), and records
`EvalText.record()` in the manifest; `edgelm verify --quality` reads a text the same way, so both measure the
same tokens of the same file.
"""

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from .. import untrusted
from ..errors import QualityError

DEFAULT_EVAL_TOKENS = 8192  # tokens measured by default: eight 1,024-token windows
MIN_EVAL_TOKENS = 2048  # the least the command line accepts: two windows; below it KL and top-1 wander
MAX_TEXT_BYTES = 8 << 20  # a text larger than this is refused, not read: 8 MiB is over a million tokens
CONTROL = set(range(32)) - {9, 10, 12, 13}  # bytes no text holds outside tab, newline, form feed, carriage return


@dataclass(frozen=True)
class EvalText:
    """A text read for measuring: its file's name, contents, sha256 and size in bytes."""

    name: str
    text: str
    sha256: str
    size: int

    @classmethod
    def read(cls, path) -> "EvalText":
        """Read a UTF-8 text file of at most MAX_TEXT_BYTES; QualityError in one line for anything else."""
        path = Path(path)
        try:
            if not path.is_file():
                raise QualityError(
                    f"the evaluation text {path} is not a file" + ("" if path.exists() else " (missing)")
                )
            size = os.stat(path).st_size
            if size > MAX_TEXT_BYTES:
                raise QualityError(
                    f"the evaluation text {path} is {size / 2**20:.1f} MiB; at most {MAX_TEXT_BYTES >> 20} MiB is "
                    "read (a few thousand tokens are measured): give a shorter text"
                )
            with untrusted.open_regular(path, QualityError) as file:  # a FIFO swapped in is refused, not waited on
                data = file.read(MAX_TEXT_BYTES + 1)
        except OSError as error:
            raise QualityError(f"cannot read the evaluation text {path}: {error.strerror or error}") from None
        if len(data) > MAX_TEXT_BYTES:  # grew since stat
            raise QualityError(f"the evaluation text {path} is over {MAX_TEXT_BYTES >> 20} MiB: give a shorter text")
        control = sum(data.count(bytes([c])) for c in CONTROL)
        if b"\0" in data or control > len(data) // 100:  # an escape sequence or two is text; NULs never are
            raise QualityError(
                f"the evaluation text {path} is binary, not text ({control} NUL or control bytes): give a UTF-8 text file"
            )
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as error:
            raise QualityError(
                f"the evaluation text {path} is not UTF-8 (byte 0x{data[error.start]:02x} at offset {error.start}); "
                "convert it first, e.g. iconv -t UTF-8"
            ) from None
        if not text.strip():
            raise QualityError(
                f"the evaluation text {path} is empty: give a text of at least {MIN_EVAL_TOKENS:,} tokens"
            )
        return cls(path.name, text, hashlib.sha256(data).hexdigest(), len(data))

    def tokens(self, tokenizer, eval_tokens: int) -> tuple:
        """(ids, prefix, total): the first eval_tokens ids of the text (no special tokens), the ids the tokenizer
        puts before any text (a BOS, or none: each window and prompt starts with them) and the text's token count.
        QualityError when the text holds fewer than eval_tokens."""
        from ..text import tokenizer as tokenizing

        ids = tokenizing.encode(tokenizer, self.text, add_special_tokens=False).ids
        if len(ids) < eval_tokens:
            raise QualityError(
                f"the evaluation text {self.name} holds {len(ids):,} tokens of this model's tokenizer; the quality "
                f"report measures {eval_tokens:,} (--eval-tokens, at least {MIN_EVAL_TOKENS:,}): give a longer text "
                "or fewer tokens"
            )
        prefix = tokenizing.encode(tokenizer, "", add_special_tokens=True).ids
        return ids[:eval_tokens], prefix, len(ids)

    def record(self, total_tokens: int, measured_tokens: int) -> dict:
        """What the manifest records of the text (validation.text)."""
        return {
            "name": self.name,
            "sha256": self.sha256,
            "bytes": self.size,
            "tokens": total_tokens,
            "measured_tokens": measured_tokens,
        }


def check_eval_tokens(eval_tokens) -> int:
    """eval_tokens as an int of at least MIN_EVAL_TOKENS; QualityError otherwise."""
    if not isinstance(eval_tokens, int) or isinstance(eval_tokens, bool) or eval_tokens < MIN_EVAL_TOKENS:
        raise QualityError(
            f"eval_tokens must be a whole number of at least {MIN_EVAL_TOKENS:,} (tokens of the evaluation text "
            f"measured; default {DEFAULT_EVAL_TOKENS:,}), got {str(eval_tokens)[:40]}"
        )
    return eval_tokens
