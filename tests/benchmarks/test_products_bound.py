"""benchmarks/products_bound.py: the graph of a package's weight products alone, and its timer."""

import edgelm.runtime as rt
import numpy as np
import pytest


@pytest.mark.parametrize(
    "fixture, products",
    [
        ("tiny_package", {"MatMul": 4 * 2 + 1}),
        ("tiny_package_int8_dynamic", {"DynamicQuantizeMatMul": 4 * 2, "QGemm": 1}),
        ("tiny_package_int8", {"MatMulNBits": 4 * 2 + 1}),
        ("tiny_package_int8_rows", {"MatMulIntegerToFloat": 4 * 2, "QGemm": 1}),  # every product's rows so
        ("tiny_package_int4", {"MatMulNBits": 4 * 2 + 1}),
    ],
)
def test_the_products_bound_runs_exactly_the_packages_weight_products(fixture, products, request):
    """benchmarks/products_bound.py: the graph of the products alone holds each product of the package's graph
    once, with the same weights, and only the LM head keeps one position when a prompt is timed."""
    from collections import Counter

    import onnx
    from products_bound import Products, products_graph

    package = request.getfixturevalue(fixture)
    graph, lm_head = products_graph(package / "model.onnx")
    quantizers = ("DynamicQuantizeLinear", "QuantizeLinear")
    found = Counter(n.op_type for n in graph.graph.node if n.op_type not in quantizers)
    assert (
        found == products
    )  # 2 layers: 4 block products each, and the LM head (one int8 slice: the vocabulary is tiny)
    full = onnx.load(str(package / "model.onnx"))
    assert found == Counter(n.op_type for n in full.graph.node if n.op_type in products)
    weights = {t.name: onnx.numpy_helper.to_array(t) for t in full.graph.initializer}
    for tensor in graph.graph.initializer:
        np.testing.assert_array_equal(onnx.numpy_helper.to_array(tensor), weights[tensor.name])
    dims = {i.name: [d.dim_param for d in i.type.tensor_type.shape.dim] for i in graph.graph.input}
    # the head's rows are one position each; a block product's are every position ([batch, sequence, K], or
    # [rows, K] where its quantizer reads them)
    assert len(lm_head) == 1 and all(n in lm_head or d[1] == "sequence" or d[0] == f"{n}.rows" for n, d in dims.items())
    timer = Products(rt.load(package, device="cpu", threads=1), threads=1)
    assert timer.count == sum(products.values())
    seconds = timer.seconds(2, 3, repeats=1)  # a batch of 2 rows of 3 positions runs, and is timed
    assert isinstance(seconds, float) and np.isfinite(seconds) and seconds > 0


def test_an_lm_head_in_slices_is_one_input_of_the_products_graph(tiny_checkpoint, tmp_path, monkeypatch):
    """The int8 head's MatMulNBits slices all read the final norm's output: the graph of the products declares it
    once (onnxruntime refuses a name defined twice) and times every slice."""
    import onnxruntime as ort
    from edgelm.export.families.gpt2.graph import build_decoder
    from edgelm.export.graph import embeddings as embeddings_module
    from edgelm.export.load import load_checkpoint
    from edgelm.export.weights_file import split_weights
    from products_bound import products_graph

    monkeypatch.setattr(embeddings_module, "ALIGN", 256)  # slices of 128 of the tiny model's 320 tokens
    checkpoint = load_checkpoint(str(tiny_checkpoint))
    decoder = build_decoder(checkpoint.arch, checkpoint.weights, "int8")
    shipped = split_weights(decoder.model.SerializeToString(), decoder.arrays)
    (tmp_path / "model.onnx").write_bytes(shipped.graph)
    (tmp_path / "model.onnx.data").write_bytes(shipped.data)
    graph, lm_head = products_graph(tmp_path / "model.onnx")
    assert sum(n.op_type == "MatMulNBits" for n in graph.graph.node) == 4 * 2 + 3 and len(lm_head) == 1
    session = ort.InferenceSession(graph.SerializeToString(), providers=["CPUExecutionProvider"])
    assert len(session.get_inputs()) == len({i.name for i in graph.graph.input})
