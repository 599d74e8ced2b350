"""The manifest's smaller sections, each a frozen dataclass that checks the JSON it is read from and writes it
back: weights (how they are stored), validation (the export's figures) and files (each file's size and sha256).
The architecture and graph sections have modules of their own; format.py puts them all together and is what the
rest of edgelm imports.
"""

import re
from dataclasses import dataclass

from .fields import FormatError, _bool, _get, _int, _object, _show, _str


@dataclass(frozen=True)
class Weights:
    """weights: how the weights are stored. quantization is the recipe's own description (export/quantize.py)."""

    dtype: str  # float32, int8 or int4
    quantization: dict  # "method" names the recipe
    tied_embedding_stored_once: bool = True

    @property
    def method(self) -> str:
        return str(self.quantization.get("method", self.dtype))

    @classmethod
    def from_dict(cls, data, where="weights") -> "Weights":
        data = _object(where, data)
        return cls(
            _get(where, data, "dtype", _str),
            _get(where, data, "quantization", _object, {}),
            _get(where, data, "tied_embedding_stored_once", _bool, True),
        )

    def to_dict(self) -> dict:
        return {
            "dtype": self.dtype,
            "tied_embedding_stored_once": self.tied_embedding_stored_once,
            "quantization": self.quantization,
        }


@dataclass(frozen=True)
class Validation:
    """validation: figures from comparing the graph with PyTorch at export, by recipe ("fp32", "int8", "int8-dynamic",
    "int4"), or why no comparison was made (`skipped`)."""

    figures: dict  # recipe -> its figures (export/validate.py)
    reference: str | None = None
    skipped: str | None = None

    @classmethod
    def from_dict(cls, data, where="validation") -> "Validation":
        data = _object(where, data)
        if "skipped" in data:
            return cls({}, skipped=_get(where, data, "skipped", _str))
        figures = {k: _object(f"{where}.{k}", v) for k, v in data.items() if k != "reference"}
        return cls(figures, _get(where, data, "reference", lambda w, v: None if v is None else _str(w, v), None))

    def to_dict(self) -> dict:
        if self.skipped is not None:
            return {"skipped": self.skipped}
        return ({"reference": self.reference} if self.reference is not None else {}) | self.figures


@dataclass(frozen=True)
class FileRecord:
    """files[name]: a file's exact size and sha256; the loader refuses any other bytes."""

    size: int
    sha256: str

    @classmethod
    def from_dict(cls, data, where) -> "FileRecord":
        data = _object(where, data)
        digest = _get(where, data, "sha256", _str)
        if not re.fullmatch(r"[0-9a-f]{64}", digest):
            raise FormatError(f"{where}.sha256 must be 64 lowercase hex digits, got {_show(digest)}")
        return cls(_get(where, data, "size", lambda w, v: _int(w, v, 0, 1 << 44)), digest)

    def to_dict(self) -> dict:
        return {"size": self.size, "sha256": self.sha256}
