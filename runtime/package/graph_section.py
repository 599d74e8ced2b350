"""The manifest's `graph` section: the ONNX decoder's file, inputs and outputs (TensorInfo), and the arrays
it reads from its weights file (TokenTable of Regions), each checked as it is read."""

import math
from dataclasses import dataclass

from .architecture import Architecture
from .fields import FormatError, _bool, _get, _int, _list, _object, _show, _str, _version, file_name

KV_CACHE_DTYPES = ("float32", "float16", "int8")  # the exporter writes float32 and int8


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

    ITEM_BYTES = {"int8": 1, "uint8": 1, "float32": 4}

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
    """graph.token_embeddings: for graphs that take inputs_embeds, where the runtime reads token rows in `file`.
    Without `block`: int8 rows [V, C] and one float32 scale per row [V]; an embedding is row * scale. With
    `block` (the int8 recipe's tied table, which the LM head's MatMulNBits reads): uint8 rows [V, C / block,
    block] around 128 and one float32 scale per block [V, C / block]; an embedding is (row - 128) * scale."""

    file: str
    rows: Region
    scale: Region
    embedding: str = "row * scale. The runtime reads the rows it needs; the LM head's QGemm parts name the same bytes."
    block: int = 0
    BLOCKS = (16, 32, 64, 128, 256)  # MatMulNBits' block sizes
    IN_BLOCKS = (
        "(row - 128) * scale, per block. The runtime reads the rows it needs; the LM head's MatMulNBits slices name the "
        "same bytes."
    )
    UNTIED = "row * scale. The runtime reads the rows it needs; no node reads them (the LM head has its own matrix)."

    @classmethod
    def from_dict(cls, data, where, arch: Architecture) -> "TokenTable":
        data = _object(where, data)
        vocab, width = arch.vocab_size, arch.n_embd
        block = _get(where, data, "block", _int, 0)
        if block and (block not in cls.BLOCKS or width % block):
            raise FormatError(f"{where}.block must be one of {cls.BLOCKS} dividing n_embd {width}, not {block}")
        rows, scale = ("int8", (vocab, width)), ("float32", (vocab,))
        if block:
            rows, scale = ("uint8", (vocab, width // block, block)), ("float32", (vocab, width // block))
        return cls(
            _get(where, data, "file", file_name),
            _get(where, data, "rows", lambda w, v: Region.from_dict(v, w, *rows)),
            _get(where, data, "scale", lambda w, v: Region.from_dict(v, w, *scale)),
            _get(where, data, "embedding", _str, cls.IN_BLOCKS if block else cls.embedding),
            block,
        )

    def to_dict(self) -> dict:
        table = {"file": self.file, "rows": self.rows.to_dict(), "scale": self.scale.to_dict()}
        return table | ({"block": self.block} if self.block else {}) | {"embedding": self.embedding}


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
        None  # the oldest onnxruntime that runs the graph (runtime/package/onnxruntime_compat.py)
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
