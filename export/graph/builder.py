"""A thin helper over onnx.helper: add nodes and initializers by name, get output names back.

It keeps the graph-building code (export/graph/, each family's graph.py) readable as a sequence of ops, the way
picoGPT reads.
"""

import itertools

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

MS_DOMAIN = "com.microsoft"
INLINE_BELOW = 1024  # bytes: smaller tensors (shapes, scalars) stay in the graph; larger ones are external data


class GraphBuilder:
    """Accumulates nodes, initializers, inputs and outputs of one ONNX graph.

    Weights of INLINE_BELOW bytes or more stay NumPy arrays (`arrays`, by name) and enter the graph as external
    data in `external_file`, placed by export/weights_file.py: the graph stays small (a protobuf cannot pass
    2 GB, and gpt2-xl's weights are 6 GB) and no weight is copied into it."""

    def __init__(self, name: str, external_file: str):
        self.name = name
        self.external_file = external_file
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self.arrays: dict[str, np.ndarray] = {}  # the external data, in the order it was added
        self._ids = itertools.count()
        self._constants: dict[tuple, str] = {}

    def input(self, name: str, elem_type: int, shape: list) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, elem_type, shape))
        return name

    def output(self, name: str, elem_type: int, shape: list) -> None:
        self.outputs.append(helper.make_tensor_value_info(name, elem_type, shape))

    def weight(self, name: str, array: np.ndarray, external: bool = False) -> str:
        """Store an array once as an initializer and return its name (external data when large or asked for)."""
        array = np.asarray(array, order="C")  # (ascontiguousarray would make a scalar 1-D)
        if array.nbytes < INLINE_BELOW and not external:
            self.initializers.append(numpy_helper.from_array(array, name))
            return name
        tensor = onnx.TensorProto(name=name, dims=array.shape, data_type=helper.np_dtype_to_tensor_dtype(array.dtype))
        tensor.data_location = onnx.TensorProto.EXTERNAL
        entry = tensor.external_data.add()
        entry.key, entry.value = "location", self.external_file
        self.initializers.append(tensor)
        self.arrays[name] = array
        return name

    def table(self, name: str, array: np.ndarray) -> str:
        """An array written to the external data file that no node reads (the runtime reads it itself)."""
        self.arrays[name] = np.asarray(array, order="C")
        return name

    def const(self, values, dtype=np.int64) -> str:
        """A small constant (shapes, axes, scalars), shared between nodes that ask for the same one."""
        array = np.asarray(values, dtype=dtype)
        key = (array.dtype.str, array.shape, array.tobytes())
        if key not in self._constants:
            self._constants[key] = self.weight(f"const_{len(self._constants)}", array)
        return self._constants[key]

    def fresh(self, prefix: str) -> str:
        """A fresh tensor name."""
        return f"{prefix}_{next(self._ids)}"

    def op(self, op_type: str, inputs: list[str], outputs: int | list[str] = 1, domain: str = "", **attrs):
        """Add one node. Returns its output name, or a list of names when it has several."""
        if isinstance(outputs, int):
            outputs = [f"{op_type.lower()}_{next(self._ids)}" for _ in range(outputs)]
        self.nodes.append(
            helper.make_node(op_type, inputs, outputs, name=f"{op_type}_{next(self._ids)}", domain=domain, **attrs)
        )
        return outputs[0] if len(outputs) == 1 else outputs

    def model(self, opset: int, doc: str) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, self.name, self.inputs, self.outputs, self.initializers)
        model = helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(MS_DOMAIN, 1)],
            producer_name="edgelm",
            doc_string=doc,
        )
        # IR 8 keeps the model loadable by onnxruntime releases from the last two years.
        model.ir_version = 8
        return model


FLOAT = TensorProto.FLOAT
INT8 = TensorProto.INT8
INT64 = TensorProto.INT64
