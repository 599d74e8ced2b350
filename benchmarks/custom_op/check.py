"""edgelm.Q8MatMul against onnxruntime's MatMulNBits on one token's weight products: the same numbers, and how fast.

    benchmarks/custom_op/build.sh ORT_INCLUDE_DIR
    python benchmarks/custom_op/check.py benchmarks/out/custom_op/libedgelm_q8.so --shape distilgpt2 --threads 1,2

Builds two graphs over the same random weights (bits 8, blocks of 32, zero point 128): a shape's products for
one token (every layer's Q/K/V, output, up and down products, and the LM head), each an independent node, once
as MatMulNBits (accuracy_level 4, int8 activations) and once as edgelm.Q8MatMul. Prints, for rows of 1, 3 and
17 tokens, the largest difference between the two over every output (absolute, and over the largest output);
then, per thread count, the median time of a run of every product for --rows rows (1: a decode step's token)
over --rounds rounds of --runs runs each (the two graphs alternating) and the GB/s that makes (weight codes and
scales read once).
"""

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

# per shape: (hidden, [(K, N) of one layer's products], layers, vocabulary)
SHAPES = {
    "distilgpt2": (768, [(768, 2304), (768, 768), (768, 3072), (3072, 768)], 6, 50257),
    "smollm2-135m": (576, [(576, 960), (576, 576), (576, 3072), (1536, 576)], 30, 49152),
    "ragged": (96, [(96, 37), (160, 70), (32, 5)], 2, 53),  # odd block counts, N not a multiple of 4: the edges
}


def products(shape):
    hidden, layer, layers, vocab = SHAPES[shape]
    return [(f"l{i}.{j}", k, n) for i in range(layers) for j, (k, n) in enumerate(layer)] + [("head", hidden, vocab)]


def build(shape, custom: bool, rng_seed=0):
    """The shape's products as one graph: inputs x{K} [1, M, K], one output per product."""
    rng = np.random.default_rng(rng_seed)
    widths = sorted({k for _, k, _ in products(shape)})
    inputs = [helper.make_tensor_value_info(f"x{k}", TensorProto.FLOAT, [1, "M", k]) for k in widths]
    nodes, outputs, initializers, weight_bytes = [], [], [], 0
    for name, k, n in products(shape):
        codes = rng.integers(0, 256, size=(n, k // 32, 32), dtype=np.uint8)
        scales = (rng.random(n * k // 32, dtype=np.float32) * 0.02 + 0.001).astype(np.float32)
        initializers += [numpy_helper.from_array(codes, f"{name}.B"), numpy_helper.from_array(scales, f"{name}.s")]
        weight_bytes += codes.nbytes + scales.nbytes
        attributes, reads = dict(K=k, N=n, bits=8, block_size=32), [f"x{k}", f"{name}.B", f"{name}.s"]
        if custom:
            node = helper.make_node("Q8MatMul", reads, [name], domain="edgelm", **attributes)
        else:
            attributes["accuracy_level"] = 4
            node = helper.make_node("MatMulNBits", reads, [name], domain="com.microsoft", **attributes)
        nodes.append(node)
        outputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, "M", n]))
    graph = helper.make_graph(nodes, "products", inputs, outputs, initializers)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1), helper.make_opsetid("edgelm", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=9), weight_bytes


def session(model_file, threads, library=None):
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    options.log_severity_level = 3
    if library:
        options.register_custom_ops_library(str(library))
    return ort.InferenceSession(str(model_file), sess_options=options, providers=["CPUExecutionProvider"])


def feeds(shape, rows, rng):
    widths = sorted({k for _, k, _ in products(shape)})
    return {f"x{k}": rng.standard_normal((1, rows, k), dtype=np.float32) for k in widths}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("library", type=Path, help="libedgelm_q8.so (benchmarks/custom_op/build.sh)")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="distilgpt2")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--runs", type=int, default=20, help="runs (tokens) per round")
    parser.add_argument("--rows", type=int, default=1, help="rows of A in the timed runs (a prompt's positions)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        files = {}
        for custom in (False, True):
            model, weight_bytes = build(args.shape, custom)
            files[custom] = Path(folder) / f"{'custom' if custom else 'stock'}.onnx"
            files[custom].write_bytes(model.SerializeToString())
        print(f"{args.shape}: {len(products(args.shape))} products, {weight_bytes / 1e6:.1f} MB of codes and scales")
        stock, custom = session(files[False], 1), session(files[True], 1, args.library)
        rng = np.random.default_rng(1)
        for rows in (1, 3, 17):
            x = feeds(args.shape, rows, rng)
            worst_abs = worst_rel = 0.0
            for a, b in zip(stock.run(None, x), custom.run(None, x)):
                worst_abs = max(worst_abs, float(np.abs(a - b).max()))
                worst_rel = max(worst_rel, float(np.abs(a - b).max() / np.abs(a).max()))
            print(f"rows {rows}: max |MatMulNBits - Q8MatMul| {worst_abs:.3g} ({worst_rel:.3g} of the largest output)")
        for threads in (int(t) for t in args.threads.split(",")):
            pair = {"MatMulNBits": session(files[False], threads)}
            pair["Q8MatMul"] = session(files[True], threads, args.library)
            x = feeds(args.shape, args.rows, rng)
            times = {name: [] for name in pair}
            for name, s in pair.items():  # warm-up
                for _ in range(5):
                    s.run(None, x)
            for round_ in range(args.rounds):
                order = list(pair) if round_ % 2 == 0 else list(pair)[::-1]
                for name in order:
                    each = []
                    for _ in range(args.runs):
                        started = time.perf_counter()
                        pair[name].run(None, x)
                        each.append(time.perf_counter() - started)
                    times[name].append(float(np.median(each)))
            base = float(np.median(times["MatMulNBits"]))
            for name, t in times.items():
                ms = 1000 * float(np.median(t))
                print(
                    f"{threads} thread(s) {name}: {ms:.3f} ms a run of {args.rows} row(s),"
                    f" {weight_bytes / ms / 1e6:.1f} GB/s,"
                    f" x{base * 1000 / ms:.3f} MatMulNBits' speed (rounds: {' '.join(f'{1000 * v:.3f}' for v in t)})"
                )


if __name__ == "__main__":
    main()
