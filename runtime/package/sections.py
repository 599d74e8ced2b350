"""The manifest's smaller sections, each a frozen dataclass that checks the JSON it is read from and writes it
back: weights (how they are stored), validation (the export's figures, the text its quality figures were
measured on) and files (each file's size and sha256).
The architecture and graph sections have modules of their own; format.py puts them all together and is what the
rest of edgelm imports.
"""

import math
import re
from dataclasses import dataclass, field

from .fields import FormatError, _bool, _get, _int, _list, _number, _object, _show, _str, file_name


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
class EvalTextRecord:
    """validation.text: the text the quality figures were measured on (runtime/quality/eval_text.py)."""

    name: str  # the file's name (export/data/'s sample, or the one given with --eval-text)
    sha256: str  # of the file's bytes
    bytes: int
    tokens: int  # the whole text, in the checkpoint's tokenizer
    measured_tokens: int  # its first tokens that were measured (--eval-tokens)

    @classmethod
    def from_dict(cls, data, where="validation.text") -> "EvalTextRecord":
        data = _object(where, data)
        digest = _get(where, data, "sha256", _str)
        if not re.fullmatch(r"[0-9a-f]{64}", digest):
            raise FormatError(f"{where}.sha256 must be 64 lowercase hex digits, got {_show(digest)}")
        tokens = _get(where, data, "tokens", _count)
        measured = _get(where, data, "measured_tokens", lambda w, v: _int(w, v, 0, tokens))
        return cls(_get(where, data, "name", _str), digest, _get(where, data, "bytes", _count), tokens, measured)

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass(frozen=True)
class QualityFigures:
    """validation[recipe]: a quantized graph against the reference on the evaluation text (runtime/quality/measure.py's
    `measure`). The logit figures are over `tokens` scored positions of windows of `window` tokens."""

    tokens: int
    perplexity_reference: float
    perplexity: float
    perplexity_change: float  # perplexity / perplexity_reference - 1
    mean_kl_divergence: float  # KL(reference || package), nats per position
    top1_agreement: float  # share of positions whose most likely token is the reference's
    window: int
    perplexity_meaningful: bool  # false where the reference's perplexity says its weights are random
    cache_path: dict  # tokens, mean_kl_divergence, top1_agreement: the last positions decoded through the cache
    greedy: dict  # continuations, prompt_tokens, tokens_each, identical, prefix_agreement, token_agreement
    kv_cache: str = "float32"

    @classmethod
    def from_dict(cls, data, where) -> "QualityFigures":
        data = _object(where, data)
        number = lambda key, low=-math.inf, high=math.inf: _get(where, data, key, lambda w, v: _number(w, v, low, high))  # noqa: E731
        cache = _get(where, data, "cache_path", _object)
        greedy = _get(where, data, "greedy", _object)
        at = f"{where}.cache_path"
        cache_path = {
            "tokens": _get(at, cache, "tokens", _count),
            "mean_kl_divergence": _get(at, cache, "mean_kl_divergence", _kl),
            "top1_agreement": _get(at, cache, "top1_agreement", _fraction),
        }
        at = f"{where}.greedy"
        greedy = {key: _get(at, greedy, key, _count) for key in ("continuations", "prompt_tokens", "tokens_each")} | {
            "identical": _get(at, greedy, "identical", lambda w, v: _int(w, v, 0, greedy["continuations"])),
            "prefix_agreement": _get(at, greedy, "prefix_agreement", _fraction),
            "token_agreement": _get(at, greedy, "token_agreement", _fraction),
        }
        return cls(
            tokens=_get(where, data, "tokens", _count),
            perplexity_reference=number("perplexity_reference", 0),
            perplexity=number("perplexity", 0),
            perplexity_change=number("perplexity_change", -1),
            mean_kl_divergence=_get(where, data, "mean_kl_divergence", _kl),
            top1_agreement=_get(where, data, "top1_agreement", _fraction),
            window=_get(where, data, "window", lambda w, v: _int(w, v, 2)),
            perplexity_meaningful=_get(where, data, "perplexity_meaningful", _bool),
            cache_path=cache_path,
            greedy=greedy,
            kv_cache=_get(where, data, "kv_cache", _str, "float32"),
        )

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass(frozen=True)
class Validation:
    """validation: figures from comparing the graph with PyTorch at export, or why no comparison was made
    (`skipped`). `figures` holds "fp32" (the parity gate's); `quality` each quantized recipe's figures, by the
    recipe's name (weights.quantization.method), measured on `text`. A package written before the evaluation
    text has no `text`: its recipes' figures (a 66-token paragraph's) stay in `figures` as they were."""

    figures: dict  # "fp32" -> its figures (export/validate.py); older packages' recipes too
    reference: str | None = None
    skipped: str | None = None
    text: EvalTextRecord | None = None
    quality: dict = field(default_factory=dict)  # recipe -> QualityFigures

    @classmethod
    def from_dict(cls, data, where="validation") -> "Validation":
        data = _object(where, data)
        if "skipped" in data:
            return cls({}, skipped=_get(where, data, "skipped", _str))
        reference = _get(where, data, "reference", lambda w, v: None if v is None else _str(w, v), None)
        text = _get(where, data, "text", lambda w, v: EvalTextRecord.from_dict(v, w), None)
        measured = {k: v for k, v in data.items() if k not in ("reference", "fp32", "text")} if text else {}
        quality = {k: QualityFigures.from_dict(v, f"{where}.{k}") for k, v in measured.items()}
        figures = {k: _object(f"{where}.{k}", v) for k, v in data.items() if k not in ("reference", "text", *quality)}
        return cls(figures, reference, text=text, quality=quality)

    def to_dict(self) -> dict:
        if self.skipped is not None:
            return {"skipped": self.skipped}
        text = {"text": self.text.to_dict()} if self.text is not None else {}
        quality = {recipe: figures.to_dict() for recipe, figures in self.quality.items()}
        return ({"reference": self.reference} if self.reference is not None else {}) | self.figures | text | quality

    def greedy_agreement(self, recipe: str) -> float | None:
        """The recorded share of greedy tokens before the first difference from the reference, for `recipe`
        (an older package's `greedy_agreement`), or None where none was measured."""
        if recipe in self.quality:
            return self.quality[recipe].greedy["prefix_agreement"]
        value = self.figures.get(recipe, {}).get("greedy_agreement")
        return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _count(where, value) -> int:
    return _int(where, value, 0)


def _fraction(where, value) -> float:
    return _number(where, value, 0.0, 1.0)


def _kl(where, value) -> float:
    return _number(where, value, -1e-3)  # KL is never negative; float32 rounding of a near-zero one may be


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


@dataclass(frozen=True)
class PromptCacheRecord:
    """prompt_cache: the key/value rows of the conversation start every chat with the export's system prompt
    (and tools) shares, prefilled at export (`edgelm export --system-prompt`) and stored in `file`
    (runtime/batching/package_prefix.py reads it). A chat whose prompt starts with those tokens starts from them."""

    file: str  # a block file of runtime/batching/prefix_store.py's format, listed in `files`
    tokens: int  # the cached tokens: the whole shared start (an older export: its whole prefill chunks)
    shared_tokens: int  # the shared start as rendered, of which `tokens` are cached
    chunk: int  # the prefill pass the rows were made in (runtime/engine/decode.py's PREFILL_CHUNK)
    system_prompt_sha256: str  # of the system prompt's UTF-8 text
    tools: tuple = ()  # the names of the tools rendered with it
    tools_sha256: str | None = None  # of the tools' JSON as given, None without tools

    @classmethod
    def from_dict(cls, data, where="prompt_cache") -> "PromptCacheRecord":
        data = _object(where, data)
        tools = _get(where, data, "tools", lambda w, v: [_str(f"{w}[]", name) for name in _list(w, v)], [])
        chunk = _get(where, data, "chunk", lambda w, v: _int(w, v, 1))
        shared = _get(where, data, "shared_tokens", lambda w, v: _int(w, v, 1))
        tokens = _get(where, data, "tokens", lambda w, v: _int(w, v, 1, shared))
        if tokens % chunk and tokens != shared:
            raise FormatError(
                f"{where}.tokens ({tokens}) must be {where}.shared_tokens ({shared}) or a multiple of {where}.chunk "
                f"({chunk})"
            )
        return cls(
            _get(where, data, "file", file_name), tokens, shared, chunk,
            _get(where, data, "system_prompt_sha256", _sha256), tuple(tools), _get(where, data, "tools_sha256", lambda w, v: None if v is None else _sha256(w, v), None),
        )  # fmt: skip

    def to_dict(self) -> dict:
        return {
            "file": self.file,
            "tokens": self.tokens,
            "shared_tokens": self.shared_tokens,
            "chunk": self.chunk,
            "system_prompt_sha256": self.system_prompt_sha256,
            "tools": list(self.tools),
            "tools_sha256": self.tools_sha256,
        }


def _sha256(where, value) -> str:
    if not isinstance(value, str) or not re.fullmatch(r"[0-9a-f]{64}", value):
        raise FormatError(f"{where} must be 64 lowercase hex digits, got {_show(value)}")
    return value
