"""What the manifest records about an export besides the checkpoint: the graph section (export/stages.py's save
stage writes it with runtime/package/format.py's typed Manifest) and the versions of the tools that made it."""

from importlib import metadata

from edgelm.runtime.package.onnxruntime_compat import graph_minimum
from edgelm.runtime.package.format import GRAPH_FILE, WEIGHTS_FILE, Graph, TensorInfo

from .graph.contract import OPSET

TOOLS = (
    "edgelm",
    "torch",
    "transformers",
    "onnx",
    "onnxruntime",
    "huggingface_hub",
    "tokenizers",
    "safetensors",
    "numpy",
)


def graph_section(shipped, kv_cache: str) -> Graph:
    """The manifest's graph section: the shipped graph's inputs and outputs as it declares them, its weights
    file and token table, the KV cache's storage and the oldest onnxruntime that runs it."""
    import onnx

    model = onnx.load_model_from_string(shipped.graph)
    uses = {(n.op_type, None) for n in model.graph.node} | {
        (n.op_type, a.name) for n in model.graph.node for a in n.attribute
    }

    def describe(value) -> TensorInfo:
        dtype = onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type).name
        return TensorInfo(dtype, tuple(d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim))

    return Graph(
        file=GRAPH_FILE,
        opset=OPSET,
        inputs={v.name: describe(v) for v in model.graph.input},
        outputs={v.name: describe(v) for v in model.graph.output},
        kv_cache_in_place=True,  # past and present may be bound to one [batch, heads, capacity, head_size] buffer
        weights_file=WEIGHTS_FILE,
        token_embeddings=shipped.token_embeddings,
        kv_cache=kv_cache_description(kv_cache),
        min_onnxruntime=graph_minimum(uses),  # measured per operator: runtime/package/onnxruntime_compat.py
    )


def kv_cache_description(kv_cache: str) -> dict:
    """How the KV cache is stored, in words and settings, for the manifest."""
    if kv_cache == "float32":
        return {"dtype": "float32"}
    from .calibrate import HEADROOM

    return {
        "dtype": "int8",
        "scales": f"fixed, one per head and channel ({HEADROOM} x the largest |K| or |V| seen / 127), calibrated at export on the PyTorch reference (export/calibrate.py); larger values are clipped",
        "op": "GroupQueryAttention kv_cache_bit_width 8, PER_CHANNEL",
    }


def tool_versions() -> dict:
    """The installed version of each of TOOLS (None where one is absent), for the manifest."""
    versions = {}
    for name in TOOLS:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions
