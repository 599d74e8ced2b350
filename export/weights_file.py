"""Stage 6a: split the graph from its weights. model.onnx keeps the graph; model.onnx.data holds every weight
as ONNX external data, large ones at 64 KiB-aligned offsets.

Why: onnxruntime maps aligned external data instead of parsing it out of the protobuf, and releases a mapped
weight once an op has prepacked it. For distilgpt2 int8 the load's own peak was 228 MB with the weights
inside model.onnx and 202 MB with them mapped (benchmarks/NOTES.md).

For graphs that take inputs_embeds (int8), the token rows come first in the file, in vocabulary order, and
their scales right after: the runtime reads the rows it needs from there (runtime/embeddings.py), while the
LM head's QGemm parts name the same bytes. The tied matrix is stored once.
"""

from dataclasses import dataclass

import numpy as np

from edgelm.runtime.embeddings import TokenEmbeddings
from edgelm.runtime.package_format import ALIGN, TOKEN_ROWS, TOKEN_SCALE, WEIGHTS_FILE, Region, TokenTable
from .errors import ExportError

INLINE_BELOW = 1024  # bytes: smaller tensors (shapes, scalars) stay in model.onnx
ALIGN_FROM = 1 << 20  # bytes: tensors this large start at an ALIGN boundary, so onnxruntime can map them


@dataclass
class ShippedGraph:
    """The graph as written: model.onnx bytes, model.onnx.data bytes, and the weights by name (which let
    validation build a session before any file exists)."""

    graph: bytes
    data: bytes
    weights: dict
    token_embeddings: TokenTable | None  # the manifest's graph.token_embeddings, for graphs that take inputs_embeds

    def embeddings(self) -> TokenEmbeddings | None:
        if self.token_embeddings is None:
            return None
        parts = _token_parts(self.weights)
        rows = np.concatenate([self.weights[name] for name in parts])
        scale = np.concatenate([self.weights[name.replace(TOKEN_ROWS, TOKEN_SCALE)] for name in parts])
        return TokenEmbeddings.from_arrays(rows, scale)


def split_weights(model) -> ShippedGraph:
    """model: an onnx.ModelProto (its initializers are moved out, in place) or its bytes."""
    import onnx
    from onnx import numpy_helper

    model = model if isinstance(model, onnx.ModelProto) else onnx.load_model_from_string(model)
    # The token rows and scales go to the file whatever their size: the runtime reads them there.
    tensors = [t for t in model.graph.initializer if len(t.raw_data) >= INLINE_BELOW or _file_order(t)[0] < 2]
    tensors.sort(key=_file_order)
    chunks, offset, offsets, weights = [], 0, {}, {}
    for tensor in tensors:
        size = len(tensor.raw_data)
        if size >= ALIGN_FROM and offset % ALIGN:
            chunks.append(bytes(ALIGN - offset % ALIGN))
            offset += ALIGN - offset % ALIGN
        weights[tensor.name] = numpy_helper.to_array(tensor)
        chunks.append(tensor.raw_data)
        offsets[tensor.name] = offset
        tensor.ClearField("raw_data")
        tensor.data_location = onnx.TensorProto.EXTERNAL
        for key, value in (("location", WEIGHTS_FILE), ("offset", str(offset)), ("length", str(size))):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value
        offset += size
    return ShippedGraph(model.SerializeToString(), b"".join(chunks), weights, _token_section(weights, offsets))


def _token_section(weights: dict, offsets: dict) -> TokenTable | None:
    """Where the token rows and their scales are in model.onnx.data; None for a graph that takes input_ids."""
    parts = _token_parts(weights)
    if not parts:
        return None
    rows = sum(weights[name].shape[0] for name in parts)
    width = weights[parts[0]].shape[1]
    for kind in (TOKEN_ROWS, TOKEN_SCALE):  # the runtime reads each region as one array
        names = [name.replace(TOKEN_ROWS, kind) for name in parts]
        ends = [offsets[name] + weights[name].nbytes for name in names]
        if [offsets[name] for name in names[1:]] != ends[:-1]:
            raise ExportError(
                f"the token table's parts are not contiguous in {WEIGHTS_FILE}; please report this with the checkpoint's config.json."
            )
    return TokenTable(
        WEIGHTS_FILE,
        Region("int8", (rows, width), offsets[parts[0]]),
        Region("float32", (rows,), offsets[parts[0].replace(TOKEN_ROWS, TOKEN_SCALE)]),
    )


def _token_parts(weights: dict) -> list:
    """The names of the token-row slices, in vocabulary order."""
    return sorted((name for name in weights if name.startswith(TOKEN_ROWS + ".")), key=_part_index)


def _file_order(tensor) -> tuple:
    """Token rows first and contiguous (part after part), then their scales, then everything else."""
    for rank, prefix in enumerate((TOKEN_ROWS + ".", TOKEN_SCALE + ".")):
        if tensor.name.startswith(prefix):
            return rank, _part_index(tensor.name)
    return 2, 0


def _part_index(name: str) -> int:
    return int(name.rsplit(".", 1)[1]) if name.rsplit(".", 1)[-1].isdigit() else 0
