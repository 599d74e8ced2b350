"""How fast could decode be with onnxruntime's weight-product kernels? The bound, measured.

    python benchmarks/products_bound.py benchmarks/out/pkg-int8 [more packages] [--rounds 5]

For each package it builds a graph of the weight products alone (every MatMul, DynamicQuantizeMatMul,
MatMulNBits, and QGemm or MatMulIntegerToFloat with the DynamicQuantizeLinear or QuantizeLinear that feeds it:
the same ops, weights and layouts as the package, each fed a [1, 1, K] activation) and times it at batch 1, in
the same rounds as the package's own decode at short context and the read probe of `edgelm bench`. A step can
be no faster than its products, so 1 / (products' time) bounds decode for these kernels even if everything else
in a step cost nothing.
The same graph gives two more bounds: batch 16 over batch 1 if nothing but the products cost (16 x the
batch-1 time over the batch-16 time), and the products of a 512-token prompt in the runtime's chunks of 128
(the first token can come no sooner). Prints one table row per package.
"""

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from edgelm.runtime.engine.session import create_session
from edgelm.runtime.model import load
from harness import SETTLE_S, ReadProbe, prompt_ids, timed_tokens
from onnx import TensorProto, helper

PRODUCTS = {"MatMul", "DynamicQuantizeMatMul", "QGemm", "MatMulNBits", "MatMulIntegerToFloat", "DynamicQuantizeLinear"}
# the quantizers of a product's activations: a QGemm or MatMulIntegerToFloat reads their [rows, K] output
QUANTIZERS = {"DynamicQuantizeLinear", "QuantizeLinear"}
PROMPT, CHUNK = 512, 128  # the first-token work: the prompt in the runtime's chunks, the LM head on one row each


def products_graph(model_file: Path) -> tuple[onnx.ModelProto, set]:
    """The package's weight products as independent nodes, their activations graph inputs ([rows, K] for
    QGemm's quantizer, [batch, sequence, K] otherwise). Also returns the inputs that feed the LM head: the
    products whose weights are not a block's (edgelm names those transformer.h.{i}.*)."""
    model = onnx.load(str(model_file))  # weights inline: the graph is saved elsewhere (at most ~330 MB)
    initializers = {t.name: t for t in model.graph.initializer}
    reads = {i for n in model.graph.node if n.op_type in PRODUCTS - QUANTIZERS for i in n.input}
    nodes = [
        n
        for n in model.graph.node
        if n.op_type in PRODUCTS - QUANTIZERS or (n.op_type in QUANTIZERS and n.output[0] in reads)
    ]
    produced = {o for n in nodes for o in n.output}
    consumers = {i: n for n in nodes for i in n.input}
    inputs, used, lm_head, declared = [], set(), set(), set()
    for node in nodes:
        used.update(i for i in node.input if i in initializers)
        for name in node.input:
            if name and name not in initializers and name not in produced and name not in declared:
                declared.add(name)  # once, though the LM head's slices all read it
                k, weight = _activation_width(node, consumers, initializers)
                # rows of their own per input: the LM head quantizes one position a row, the blocks every one
                shape = [f"{name}.rows", k] if node.op_type in QUANTIZERS else ["batch", "sequence", k]
                inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, shape))
                if not weight.startswith("transformer.h."):
                    lm_head.add(name)
    outputs = [
        helper.make_tensor_value_info(o, TensorProto.FLOAT, None)
        for n in nodes
        if n.op_type not in QUANTIZERS
        for o in n.output
    ]
    graph = helper.make_graph(nodes, "weight_products", inputs, outputs, [initializers[name] for name in sorted(used)])
    return helper.make_model(graph, opset_imports=model.opset_import, ir_version=model.ir_version), lm_head


def _activation_width(node, consumers, initializers) -> tuple[int, str]:
    """K, the activation's width, read from the product's weights; and the weights' name."""
    if node.op_type in QUANTIZERS:  # feeds QGemm with B [N, K] (transB = 1) or MatMulIntegerToFloat with B [K, N]
        product = consumers[node.output[0]]
        if product.op_type == "MatMulIntegerToFloat":
            return initializers[product.input[1]].dims[0], product.input[1]
        return initializers[product.input[3]].dims[1], product.input[3]
    if node.op_type == "MatMulNBits":
        return next(a.i for a in node.attribute if a.name == "K"), node.input[1]
    return initializers[node.input[1]].dims[0], node.input[1]  # MatMul, DynamicQuantizeMatMul: B [K, N]


class Products:
    """Times the products graph for a given batch and sequence (the LM head always on the last position)."""

    def __init__(self, model, threads: int):
        graph, self.lm_head = products_graph(model.package.model_file)
        self.count = sum(n.op_type not in QUANTIZERS for n in graph.graph.node)
        with tempfile.TemporaryDirectory() as folder:
            onnx.save(graph, f"{folder}/products.onnx")
            self.session, _ = create_session(f"{folder}/products.onnx", "cpu", threads)
        self.inputs = {i.name: i.shape[-1] for i in self.session.get_inputs()}
        self.rows = {i.name: len(i.shape) == 2 for i in self.session.get_inputs()}

    def seconds(self, batch: int, sequence: int, repeats: int = 21) -> float:
        rng, feeds = np.random.default_rng(0), {}
        for name, k in self.inputs.items():
            tokens = 1 if name in self.lm_head else sequence
            shape = [batch * tokens, k] if self.rows[name] else [batch, tokens, k]
            feeds[name] = rng.standard_normal(shape).astype(np.float32)
        times = []
        for _ in range(repeats + 1):  # the first is a warm-up
            started = time.perf_counter()
            self.session.run(None, feeds)
            times.append(time.perf_counter() - started)
        return float(np.median(times[1:]))


def measure(package: Path, rounds: int, threads: int) -> dict:
    model = load(package, device="cpu", threads=threads)
    products = Products(model, threads)
    probe = ReadProbe(model.package.weight_bytes, threads)
    timed_tokens(model, [prompt_ids(model, 8)], 8)  # warm-up
    figures = {key: [] for key in ("decode", "one", "sixteen", "prompt", "read")}
    for r in range(rounds):
        time.sleep(SETTLE_S)
        figures["decode"].append(127 / timed_tokens(model, [prompt_ids(model, 8, r)], 128)[1])
        time.sleep(SETTLE_S)
        figures["one"].append(products.seconds(1, 1))
        figures["sixteen"].append(products.seconds(16, 1, repeats=5))
        figures["prompt"].append(PROMPT // CHUNK * products.seconds(1, CHUNK, repeats=3))
        time.sleep(SETTLE_S)
        figures["read"].append(probe.seconds())
    median = lambda values: float(np.median(values))  # noqa: E731
    one, read, decode = figures["one"], figures["read"], figures["decode"]
    return {
        "package": str(package),
        "products": products.count,
        "ceiling_tok_s": 1 / median(read),
        "products_alone_tok_s": 1 / median(one),
        "decode_tok_s": median(decode),
        "products_alone_fraction": median([s / p for s, p in zip(read, one)]),
        "decode_fraction": median([d * s for d, s in zip(decode, read)]),
        "products_share_of_step": median([d * p for d, p in zip(decode, one)]),
        "batch_16_over_1_products_alone": median([16 * p1 / p16 for p1, p16 in zip(one, figures["sixteen"])]),
        "prompt_512_products_ms": 1000 * median(figures["prompt"]),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("packages", nargs="+", type=Path)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    args = parser.parse_args()
    print(
        "| package | products | ceiling tok/s | products alone tok/s | decode tok/s | products alone / ceiling | decode / ceiling "
        "| products' share of a step | batch 16 / batch 1, products alone | 512-token prompt, products alone |"
    )
    print("| --- " * 10 + "|")
    for package in args.packages:
        r = measure(package, args.rounds, args.threads)
        print(
            f"| {package.name} | {r['products']} | {r['ceiling_tok_s']:.1f} | {r['products_alone_tok_s']:.1f} | {r['decode_tok_s']:.1f} | "
            f"{r['products_alone_fraction']:.2f} | {r['decode_fraction']:.2f} | {r['products_share_of_step']:.2f} | "
            f"{r['batch_16_over_1_products_alone']:.2f}x | {r['prompt_512_products_ms']:.0f} ms |",
            flush=True,
        )


if __name__ == "__main__":
    main()
