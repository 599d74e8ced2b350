"""One weight product alone at 1 and at 16 rows, kernel by kernel: what a batch step's products cost per row.

    python benchmarks/product_rows.py [--shapes 768x3072,768x50257] [--rows 1,16] [--threads 2] [--repeats 15]

For each [K, N] shape (K inputs, N outputs), a one-node graph per kernel, random weights, timed on [rows, K]
activations: MatMulNBits at 4 bits (blocks of 128 with zero points, as the int4 recipe; 128 without; 64; 32;
accuracy level 1, float32 activations), at 8 bits (blocks of 64 as the int8 recipe, 32, 128), and QGemm over
int8 weights fed by a QuantizeLinear (int8-rows' LM head kernel). Prints each one's median ms at each row count and the
largest count's time over one row's. The weights are read again at once, so a small one stays in the caches: one
row's time is the kernel's at best, not a decode step's share (memory-bound there); many rows' is its compute.
"""

import argparse
import os
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

MS = "com.microsoft"
# (label, bits, block, accuracy level, zero points)
NBITS = [
    ("MatMulNBits 4-bit, blocks of 128, zero points (int4)", 4, 128, 4, True),
    ("MatMulNBits 4-bit, blocks of 128", 4, 128, 4, False),
    ("MatMulNBits 4-bit, blocks of 64, zero points", 4, 64, 4, True),
    ("MatMulNBits 4-bit, blocks of 32, zero points", 4, 32, 4, True),
    ("MatMulNBits 4-bit, blocks of 128, accuracy level 1", 4, 128, 1, True),
    ("MatMulNBits 8-bit, blocks of 64 (int8)", 8, 64, 4, False),
    ("MatMulNBits 8-bit, blocks of 32", 8, 32, 4, False),
    ("MatMulNBits 8-bit, blocks of 128", 8, 128, 4, False),
]


def model(nodes, inits, k, n) -> bytes:
    a = helper.make_tensor_value_info("A", TensorProto.FLOAT, ["rows", k])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["rows", n])
    graph = helper.make_graph(nodes, "product", [a], [y], inits)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)]
    return helper.make_model(graph, opset_imports=opsets).SerializeToString()


def nbits(k, n, bits, block, level, zero_points, rng) -> bytes:
    blocks = -(-k // block)
    inits = [
        numpy_helper.from_array(rng.integers(0, 256, (n, blocks, block * bits // 8), dtype=np.uint8), "B"),
        numpy_helper.from_array((rng.random((n, blocks)) * 0.01 + 0.001).astype(np.float32), "scales"),
    ]
    if zero_points:
        inits.append(numpy_helper.from_array(rng.integers(0, 256, (n, -(-blocks * bits // 8)), dtype=np.uint8), "zp"))
    node = helper.make_node("MatMulNBits", ["A", *(t.name for t in inits)], ["Y"], domain=MS, K=k, N=n, bits=bits,
                            block_size=block, accuracy_level=level)  # fmt: skip
    return model([node], inits, k, n)


def qgemm(k, n, rng) -> bytes:
    inits = [
        numpy_helper.from_array(np.array(1 / 127, np.float32), "a_scale"),
        numpy_helper.from_array(np.array(128, np.uint8), "a_zero"),
        numpy_helper.from_array(rng.integers(-127, 128, (n, k), dtype=np.int8), "W"),
        numpy_helper.from_array(np.full(n, 0.01, np.float32), "w_scale"),
        numpy_helper.from_array(np.zeros(n, np.int8), "w_zero"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["A", "a_scale", "a_zero"], ["Aq"]),
        helper.make_node("QGemm", ["Aq", "a_scale", "a_zero", "W", "w_scale", "w_zero"], ["Y"], domain=MS, transB=1),
    ]
    return model(nodes, inits, k, n)


def timed(graph: bytes, k: int, rows: list, threads: int, repeats: int) -> dict:
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.log_severity_level = threads, 4
    session = ort.InferenceSession(graph, options, providers=["CPUExecutionProvider"])
    result = {}
    for m in rows:
        a = np.random.default_rng(1).standard_normal((m, k), dtype=np.float32)
        times = []
        for i in range(repeats + 3):  # 3 warm-ups
            started = time.perf_counter()
            session.run(None, {"A": a})
            times.append(time.perf_counter() - started)
        result[m] = 1000 * float(np.median(times[3:]))
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="768x3072,768x50257", help="KxN[,KxN...]")
    parser.add_argument("--rows", default="1,16")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    print(f"load average {os.getloadavg()[0]:.2f}, onnxruntime {ort.__version__}, {args.threads} thread(s)")
    print("| K x N | kernel | " + " | ".join(f"{m} row(s) ms" for m in rows) + f" | {rows[-1]} / {rows[0]} |")
    print("| --- | --- |" + " ---: |" * (len(rows) + 1))
    for shape in args.shapes.split(","):
        k, n = (int(x) for x in shape.split("x"))
        rng = np.random.default_rng(0)
        graphs = [(label, nbits(k, n, b, s, level, z, rng)) for label, b, s, level, z in NBITS]
        graphs.append(("QGemm, int8 weights, QuantizeLinear before it (int8-rows' head)", qgemm(k, n, rng)))
        for label, graph in graphs:
            ms = timed(graph, k, rows, args.threads, args.repeats)
            cells = " | ".join(f"{ms[m]:.3f}" for m in rows)
            print(f"| {k} x {n} | {label} | {cells} | {ms[rows[-1]] / ms[rows[0]]:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
