"""The sections of a package manifest, each a frozen dataclass that checks the JSON it is read from (types
and ranges, naming the field in every complaint) and writes it back. package_format.py puts them together
and is what the rest of edgelm imports; this module holds no file names or constants of its own.
"""

import math
import re
from dataclasses import MISSING, asdict, dataclass


class FormatError(ValueError):
    """A JSON value does not fit the package format. The message names the field; the caller turns it into
    its own error (PackageError at load). `advice` replaces the caller's usual advice where it would mislead."""

    def __init__(self, message: str, advice: str | None = None):
        super().__init__(message)
        self.advice = advice


def _kind(value) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "true/false", type(None): "null"}.get(
        type(value), "a number"
    )


def _show(value) -> str:
    text = repr(value) if not isinstance(value, (dict, list)) else _kind(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _int(where, value, low=0, high=1 << 62):
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise FormatError(f"{where} must be an integer from {low} to {high}, got {_show(value)}")
    return value


def _number(where, value, low=-math.inf, high=math.inf):
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or not low <= value <= high:
        raise FormatError(f"{where} must be a finite number from {low} to {high}, got {_show(value)}")
    return float(value)


def _str(where, value):
    if not isinstance(value, str):
        raise FormatError(f"{where} must be a string, got {_show(value)}")
    return value


def _bool(where, value):
    if not isinstance(value, bool):
        raise FormatError(f"{where} must be true or false, got {_show(value)}")
    return value


def _version(where, value) -> str:
    if not isinstance(value, str) or not re.fullmatch(r"\d{1,4}(\.\d{1,6}){0,3}", value):
        raise FormatError(f"{where} must be a version such as \"1.22\", got {_show(value)}")
    return value


def _object(where, value) -> dict:
    if not isinstance(value, dict):
        raise FormatError(f"{where} must be an object, got {_kind(value)}")
    return value


def _list(where, value) -> list:
    if not isinstance(value, list):
        raise FormatError(f"{where} must be a list, got {_kind(value)}")
    return value


def _get(where, data, key, read, default=MISSING):
    """data[key] checked by read(field name, value); a missing key is the default, or an error without one."""
    path = f"{where}.{key}" if where else key
    if key not in data:
        if default is MISSING:
            raise FormatError(f"{path} is missing")
        return default
    return read(path, data[key])


def file_name(where, value) -> str:
    """A file of the package: a plain name in its folder, never a path that could lead out of it."""
    name = _str(where, value)
    if not name or name in (".", "..") or len(name) > 255 or any(c in name for c in "/\\\0:"):
        raise FormatError(f"{where} must be a plain file name inside the package folder, got {_show(name)}")
    return name


@dataclass(frozen=True)
class Architecture:
    """The shape of a decoder (GPT-2, Llama or Qwen2), as written in the package manifest."""

    n_layer: int  # decoder blocks
    n_head: int  # attention heads per block
    head_size: int  # width of one head; n_head * head_size == n_embd
    n_embd: int  # residual stream width
    n_positions: int  # context length: the largest past + new tokens the position table covers
    vocab_size: int  # rows of the (tied) embedding, columns of the logits
    bos_token_id: int | None  # token GPT-2 starts unconditional text from (end-of-text for GPT-2)
    eos_token_id: int | None  # generation stops here unless told to ignore it
    pad_token_id: int | None  # None for GPT-2: padding is carried by the attention mask alone
    layer_norm_epsilon: float = 1e-5
    model_type: str = "gpt2"
    # Under GPT2Config's names; the Llama family uses n_inner (its intermediate_size), activation_function
    # (silu: its SwiGLU MLP's) and tie_word_embeddings too. The graph computes them; the manifest says which.
    n_inner: int | None = None  # MLP width; None is 4 * n_embd
    activation_function: str = "gelu_new"  # the MLP's activation, a name in transformers' ACT2FN
    tie_word_embeddings: bool = True  # the LM head is the token embedding (stored once), else a matrix of its own
    scale_attn_weights: bool = True  # attention scores divided by sqrt(head_size) ...
    scale_attn_by_inverse_layer_idx: bool = False  # ... and by the layer's index + 1

    @property
    def mlp_width(self) -> int:
        return self.n_inner or 4 * self.n_embd

    def attention_scale(self, layer: int) -> float:
        """The factor on layer `layer`'s (0-based) query-key products: GPT-2's scale rule."""
        scale = 1 / math.sqrt(self.head_size) if self.scale_attn_weights else 1.0
        return scale / (layer + 1) if self.scale_attn_by_inverse_layer_idx else scale

    def attention_scale_rule(self) -> str:
        rule = "1/sqrt(head_size)" if self.scale_attn_weights else "1"
        return rule + (" / (layer + 1)" if self.scale_attn_by_inverse_layer_idx else "")

    # The Llama family (model_type "llama", "qwen2"; positions "rope"). GPT-2's values are the defaults, and a
    # GPT-2 manifest leaves these fields out.
    n_kv_head: int | None = None  # key/value heads (grouped-query attention); None: one per attention head
    norm: str = "layernorm"  # "layernorm" (x - mean, scale, bias) or "rmsnorm" (x / rms(x), scale only)
    positions: str = "learned"  # "learned" (a position table) or "rope" (rotary; cos/sin tables baked at export)
    rope_theta: float | None = None  # the rotary base
    rope_scaling: dict | None = None  # Hugging Face's rope_scaling, e.g. {"rope_type": "llama3", "factor": 32.0, ...}
    biases: tuple | None = None  # the projections that have a bias (e.g. q_proj, k_proj, v_proj); None: GPT-2's, all

    @property
    def kv_heads(self) -> int:
        """Heads of the key/value cache: [batch, kv_heads, positions, head_size]."""
        return self.n_kv_head or self.n_head

    def to_dict(self) -> dict:
        data = asdict(self)
        if self.positions == "learned":  # GPT-2: the family fields are all at their defaults
            for key in FAMILY_FIELDS:
                data.pop(key)
        elif self.biases is not None:
            data["biases"] = list(self.biases)
        return data

    @classmethod
    def from_dict(cls, data, where: str = "architecture") -> "Architecture":
        data = _object(where, data)
        size = {k: _get(where, data, k, lambda w, v: _int(w, v, 1, 1 << 20)) for k in ("n_layer", "n_head")}
        size["head_size"] = _get(where, data, "head_size", lambda w, v: _int(w, v, 1, 1 << 16))
        size["n_embd"] = _get(where, data, "n_embd", lambda w, v: _int(w, v, 1, 1 << 20))
        if size["n_head"] * size["head_size"] != size["n_embd"]:
            raise FormatError(f"{where}: n_head x head_size must equal n_embd, got {size}")
        size["n_positions"] = _get(where, data, "n_positions", lambda w, v: _int(w, v, 1, 1 << 24))
        vocab = size["vocab_size"] = _get(where, data, "vocab_size", lambda w, v: _int(w, v, 1, 1 << 24))
        token = lambda w, v: None if v is None else _int(w, v, 0, vocab - 1)  # noqa: E731
        ids = {k: _get(where, data, k, token) for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
        epsilon = _get(where, data, "layer_norm_epsilon", lambda w, v: _number(w, v, 1e-30, 1.0), 1e-5)
        gpt2 = {
            "n_inner": _get(where, data, "n_inner", lambda w, v: None if v is None else _int(w, v, 1, 1 << 24), None),
            "activation_function": _get(where, data, "activation_function", _str, "gelu_new"),
            **{
                k: _get(where, data, k, _bool, default)
                for k, default in (
                    ("tie_word_embeddings", True),
                    ("scale_attn_weights", True),
                    ("scale_attn_by_inverse_layer_idx", False),
                )
            },
        }
        model_type = _get(where, data, "model_type", _str, "gpt2")
        return cls(
            **size,
            **ids,
            layer_norm_epsilon=epsilon,
            model_type=model_type,
            **gpt2,
            **_family_fields(where, data, size["n_head"]),
        )

    @classmethod
    def from_hf_config(cls, config, where: str = "config.json") -> "Architecture":
        """Read a Hugging Face GPT-2 config.json (also used for optimum-exported folders)."""
        config = _object(where, config)
        n_embd = _get(where, config, "n_embd", lambda w, v: _int(w, v, 1, 1 << 20))
        n_head = _get(where, config, "n_head", lambda w, v: _int(w, v, 1, 1 << 20))
        if n_embd % n_head:
            raise FormatError(f"{where}: n_embd ({n_embd}) must be a multiple of n_head ({n_head})")
        eos = config.get("eos_token_id")
        return cls.from_dict(
            {
                "n_layer": config.get("n_layer"),
                "n_head": n_head,
                "head_size": n_embd // n_head,
                "n_embd": n_embd,
                "n_positions": config.get("n_positions") or config.get("n_ctx"),
                "vocab_size": config.get("vocab_size"),
                "bos_token_id": config.get("bos_token_id"),
                "eos_token_id": eos[0] if isinstance(eos, list) and eos else eos,
                "pad_token_id": config.get("pad_token_id"),
                "layer_norm_epsilon": config.get("layer_norm_epsilon", 1e-5),
                "model_type": config.get("model_type", "gpt2"),
                "n_inner": config.get("n_inner"),
                "activation_function": config.get("activation_function", "gelu_new"),
                "tie_word_embeddings": config.get("tie_word_embeddings", True),
                "scale_attn_weights": config.get("scale_attn_weights", True),
                "scale_attn_by_inverse_layer_idx": config.get("scale_attn_by_inverse_layer_idx", False),
            },
            where,
        )


KV_CACHE_DTYPES = ("float32", "float16", "int8")  # the exporter writes float32 and int8
FAMILY_FIELDS = (
    "n_kv_head",
    "norm",
    "positions",
    "rope_theta",
    "rope_scaling",
    "biases",
)


def _choice(options):
    def read(where, value):
        if value not in options:
            raise FormatError(f"{where} must be one of {', '.join(options)}, got {_show(value)}")
        return value

    return read


def _family_fields(where: str, data: dict, n_head: int) -> dict:
    """The Llama-family fields of architecture, each checked; absent ones keep GPT-2's defaults."""
    kv = _get(where, data, "n_kv_head", lambda w, v: None if v is None else _int(w, v, 1, n_head), None)
    if kv is not None and n_head % kv:
        raise FormatError(f"{where}.n_kv_head must divide n_head ({n_head}), got {kv}")
    biases = _get(where, data, "biases", lambda w, v: None if v is None else tuple(_list(w, v)), None)
    for k, name in enumerate(biases or ()):
        _str(f"{where}.biases[{k}]", name)
    return {
        "n_kv_head": kv,
        "norm": _get(where, data, "norm", _choice(("layernorm", "rmsnorm")), "layernorm"),
        "positions": _get(where, data, "positions", _choice(("learned", "rope")), "learned"),
        "rope_theta": _get(where, data, "rope_theta", lambda w, v: None if v is None else _number(w, v, 1e-6), None),
        "rope_scaling": _get(where, data, "rope_scaling", lambda w, v: None if v is None else _object(w, v), None),
        "biases": biases,
    }


@dataclass(frozen=True)
class TensorInfo:
    """One graph input or output: its element type and shape (integers, or names for dimensions that vary)."""

    dtype: str
    shape: tuple

    @classmethod
    def from_dict(cls, data, where) -> "TensorInfo":
        data = _object(where, data)
        shape = _get(where, data, "shape", _list)
        for k, dim in enumerate(shape):
            if not isinstance(dim, str):
                _int(f"{where}.shape[{k}]", dim, 0, 1 << 40)
        return cls(_get(where, data, "dtype", _str), tuple(shape))

    def to_dict(self) -> dict:
        return {"dtype": self.dtype, "shape": list(self.shape)}


@dataclass(frozen=True)
class Region:
    """An array stored at a byte offset of a package file."""

    dtype: str
    shape: tuple[int, ...]
    offset: int

    ITEM_BYTES = {"int8": 1, "float32": 4}

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.ITEM_BYTES[self.dtype]

    @classmethod
    def from_dict(cls, data, where, dtype: str, shape: tuple) -> "Region":
        data = _object(where, data)
        if _get(where, data, "dtype", _str) != dtype or _get(where, data, "shape", lambda w, v: v) != list(shape):
            raise FormatError(
                f"{where} must be {dtype} {where.rsplit('.', 1)[-1]} {list(shape)}, as edgelm export writes it"
            )
        return cls(dtype, shape, _get(where, data, "offset", _int))

    def to_dict(self) -> dict:
        return {"dtype": self.dtype, "shape": list(self.shape), "offset": self.offset}


@dataclass(frozen=True)
class TokenTable:
    """graph.token_embeddings: for graphs that take inputs_embeds, where the runtime reads token rows: int8
    rows [V, C] and one float32 scale per row [V] in `file`; an embedding is row * scale."""

    file: str
    rows: Region
    scale: Region
    embedding: str = "row * scale. The runtime reads the rows it needs; the LM head's QGemm parts name the same bytes."

    @classmethod
    def from_dict(cls, data, where, arch: Architecture) -> "TokenTable":
        data = _object(where, data)
        vocab, width = arch.vocab_size, arch.n_embd
        return cls(
            _get(where, data, "file", file_name),
            _get(where, data, "rows", lambda w, v: Region.from_dict(v, w, "int8", (vocab, width))),
            _get(where, data, "scale", lambda w, v: Region.from_dict(v, w, "float32", (vocab,))),
            _get(where, data, "embedding", _str, cls.embedding),
        )

    def to_dict(self) -> dict:
        return {
            "file": self.file,
            "rows": self.rows.to_dict(),
            "scale": self.scale.to_dict(),
            "embedding": self.embedding,
        }


@dataclass(frozen=True)
class Graph:
    """graph: the ONNX decoder, its inputs and outputs, and the files it reads."""

    file: str
    inputs: dict  # name -> TensorInfo
    outputs: dict
    opset: int = 17
    kv_cache_in_place: bool = False  # past and present may be bound to one [batch, heads, capacity, head_size] buffer
    weights_file: str | None = None  # the graph's external data
    token_embeddings: TokenTable | None = None
    kv_cache: dict | None = None  # {"dtype": "float32" | "int8", ...how it is scaled}
    min_onnxruntime: str | None = (
        None  # the oldest onnxruntime that runs the graph (runtime/engine/onnxruntime_compat.py)
    )
    logits_to_keep: str = "optional scalar input, default 0 = logits for every position; 1 = last position only"
    past_layout: str = "[batch, heads, past_sequence, head_size]"

    @property
    def kv_cache_dtype(self) -> str:
        return (self.kv_cache or {}).get("dtype", "float32")

    @classmethod
    def from_dict(cls, data, where, arch: Architecture) -> "Graph":
        data = _object(where, data)
        tensors = lambda w, v: {n: TensorInfo.from_dict(t, f"{w}.{n}") for n, t in _object(w, v).items()}  # noqa: E731
        kv_cache = _get(where, data, "kv_cache", _object, None)
        if kv_cache is not None and _get(f"{where}.kv_cache", kv_cache, "dtype", _str) not in KV_CACHE_DTYPES:
            raise FormatError(
                f"{where}.kv_cache.dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got {_show(kv_cache['dtype'])}"
            )
        graph = cls(
            file=_get(where, data, "file", file_name),
            inputs=_get(where, data, "inputs", tensors, {}),
            outputs=_get(where, data, "outputs", tensors, {}),
            opset=_get(where, data, "opset", lambda w, v: _int(w, v, 1, 1000), 17),
            kv_cache_in_place=_get(where, data, "kv_cache_in_place", _bool, False),
            weights_file=_get(where, data, "weights_file", lambda w, v: None if v is None else file_name(w, v), None),
            token_embeddings=_get(where, data, "token_embeddings", lambda w, v: TokenTable.from_dict(v, w, arch), None),
            kv_cache=kv_cache,
            min_onnxruntime=_get(where, data, "min_onnxruntime", _version, None),
            logits_to_keep=_get(where, data, "logits_to_keep", _str, cls.logits_to_keep),
            past_layout=_get(where, data, "past_layout", _str, cls.past_layout),
        )
        logits = graph.outputs.get("logits")
        if (
            logits is not None
            and logits.shape
            and isinstance(logits.shape[-1], int)
            and logits.shape[-1] != arch.vocab_size
        ):
            raise FormatError(
                f"architecture.vocab_size is {arch.vocab_size} but the graph's logits have {logits.shape[-1]} columns"
            )
        return graph

    def to_dict(self) -> dict:
        data = {
            "file": self.file,
            "opset": self.opset,
            "inputs": {n: t.to_dict() for n, t in self.inputs.items()},
            "outputs": {n: t.to_dict() for n, t in self.outputs.items()},
            "logits_to_keep": self.logits_to_keep,
            "past_layout": self.past_layout,
            "kv_cache_in_place": self.kv_cache_in_place,
        }
        if self.weights_file is not None:
            data["weights_file"] = self.weights_file
        if self.token_embeddings is not None:
            data["token_embeddings"] = self.token_embeddings.to_dict()
        if self.kv_cache is not None:
            data["kv_cache"] = self.kv_cache
        if self.min_onnxruntime is not None:
            data["min_onnxruntime"] = self.min_onnxruntime
        return data


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
    """validation: figures from comparing the graph with PyTorch at export, by recipe ("fp32", "int8",
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
