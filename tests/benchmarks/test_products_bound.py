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
