"""Stage 6a: split the graph from its weights. model.onnx keeps the graph; model.onnx.data holds every weight
as ONNX external data, large ones at 64 KiB-aligned offsets.

Why: onnxruntime maps aligned external data instead of parsing it out of the protobuf, and releases a mapped
weight once an op has prepacked it. For distilgpt2 int8 the load's own peak was 228 MB with the weights
inside model.onnx and 202 MB with them mapped (benchmarks/NOTES.md).

For graphs that take inputs_embeds (int8), the token rows come first in the file, in vocabulary order, and
their scales right after: the runtime reads the rows it needs from there (runtime/engine/embeddings.py). Tied, the
LM head (the int8 recipe's MatMulNBits, the other recipes' QGemm parts) names the same bytes and the matrix is
stored once; untied, no node reads the rows and the LM head has parts of its own.
"""

from dataclasses import dataclass

import numpy as np
from edgelm.runtime.engine.embeddings import TokenEmbeddings
from edgelm.runtime.package.format import ALIGN, TOKEN_ROWS, TOKEN_SCALE, WEIGHTS_FILE, Region, TokenTable

from .errors import ExportError

ALIGN_FROM = 1 << 20  # bytes: tensors this large start at an ALIGN boundary, so onnxruntime can map them


@dataclass
class ShippedGraph:
    """The graph as written: model.onnx bytes, and model.onnx.data as (offset, array) pieces that are written
    one after the other (never joined in memory: gpt2-xl's are 6 GB). `weights` are the graph's external
    initializers by name, which let validation build a session before any file exists."""

    graph: bytes
    pieces: list  # (name, offset, array) in file order
    size: int  # bytes of model.onnx.data
    weights: dict  # name -> array: what the graph reads from model.onnx.data
    token_embeddings: TokenTable | None  # the manifest's graph.token_embeddings, for graphs that take inputs_embeds

    def chunks(self):
        """model.onnx.data's bytes, in order: zero padding before aligned pieces, then each array's own memory."""
        end = 0
        for _, offset, array in self.pieces:
            if offset > end:
                yield bytes(offset - end)
            yield memoryview(array).cast("B")
            end = offset + array.nbytes

    @property
    def data(self) -> bytes:
        return b"".join(self.chunks())

    def embeddings(self) -> TokenEmbeddings | None:
        if self.token_embeddings is None:
            return None
        arrays = {name: array for name, _, array in self.pieces}
        parts = _token_parts(arrays)
        rows = np.concatenate([arrays[name] for name in parts])
        scale = np.concatenate([arrays[name.replace(TOKEN_ROWS, TOKEN_SCALE)] for name in parts])
        return TokenEmbeddings.from_arrays(rows, scale)


def split_weights(model_bytes: bytes, arrays: dict) -> ShippedGraph:
    """Place `arrays` (export/graph/builder.py's external data) in model.onnx.data and write each one's offset
    and length into the graph's references to it."""
    import onnx

    model = onnx.load_model_from_string(model_bytes)
    external = {t.name: t for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL}
    unplaced = set(external) - set(arrays)
    if unplaced:
        raise ExportError(
            f"the graph names external weights it was not given ({sorted(unplaced)[0]}); please report this."
        )
    names = sorted(arrays, key=_file_order)  # stable: otherwise in the order the graph added them
    pieces, offset = [], 0
    for name in names:
        array = arrays[name]
        if array.nbytes >= ALIGN_FROM and offset % ALIGN:
            offset += ALIGN - offset % ALIGN
        pieces.append((name, offset, array))
        tensor = external.get(name)
        if tensor is not None:  # else a table only the runtime reads (the untied int8 token rows)
            del tensor.external_data[:]
            for key, value in (("location", WEIGHTS_FILE), ("offset", str(offset)), ("length", str(array.nbytes))):
                entry = tensor.external_data.add()
                entry.key, entry.value = key, value
        offset += array.nbytes
    offsets = {name: at for name, at, _ in pieces}
    return ShippedGraph(
        model.SerializeToString(),
        pieces,
        offset,
        {name: arrays[name] for name in external},
        _token_section(arrays, offsets, set(external)),
    )


def _token_section(weights: dict, offsets: dict, named: set) -> TokenTable | None:
    """Where the token rows and their scales are in model.onnx.data; None for a graph that takes input_ids.
    named: the arrays the graph names; where it names the rows, the LM head reads them (a tied head), else only
    the runtime does (untied)."""
    parts = _token_parts(weights)
    if not parts:
        return None
    read_by_graph = not named.isdisjoint(parts)
    first, scale_name = weights[parts[0]], parts[0].replace(TOKEN_ROWS, TOKEN_SCALE)
    rows = sum(weights[name].shape[0] for name in parts)
    for kind in (TOKEN_ROWS, TOKEN_SCALE):  # the runtime reads each region as one array
        names = [name.replace(TOKEN_ROWS, kind) for name in parts]
        ends = [offsets[name] + weights[name].nbytes for name in names]
        if [offsets[name] for name in names[1:]] != ends[:-1]:
            raise ExportError(
                f"the token table's parts are not contiguous in {WEIGHTS_FILE}; please report this with the checkpoint's config.json."
            )
    in_blocks = first.ndim == 3  # the int8 recipe's tied matrix in MatMulNBits' blocks; else int8 rows [V, C]
    return TokenTable(
        WEIGHTS_FILE,
        Region("uint8" if in_blocks else "int8", (rows, *first.shape[1:]), offsets[parts[0]]),
        Region("float32", (rows, *weights[scale_name].shape[1:]), offsets[scale_name]),
        TokenTable.IN_BLOCKS if in_blocks else TokenTable.embedding if read_by_graph else TokenTable.UNTIED,
        first.shape[2] if in_blocks else 0,
    )


def _token_parts(weights: dict) -> list:
    """The names of the token-row slices, in vocabulary order."""
    return sorted((name for name in weights if name.startswith(TOKEN_ROWS + ".")), key=_part_index)


def _file_order(name: str) -> tuple:
    """Token rows first and contiguous (part after part), then their scales, then everything else."""
    for rank, prefix in enumerate((TOKEN_ROWS + ".", TOKEN_SCALE + ".")):
        if name.startswith(prefix):
            return rank, _part_index(name)
    return 2, 0


def _part_index(name: str) -> int:
    return int(name.rsplit(".", 1)[1]) if name.rsplit(".", 1)[-1].isdigit() else 0
