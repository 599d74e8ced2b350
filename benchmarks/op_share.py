"""Each op type's share of a batch-1 decode step, and its count per layer: medians over repeated profiles.

    python benchmarks/op_share.py PKG [PKG ...] [--threads 2] [--steps 32] [--repeats 3] [--past 8]
    python benchmarks/op_share.py PKG --option session.intra_op.allow_spinning=0

For each package, --repeats times: a fresh session with onnxruntime's profiler on, a prompt of --past positions,
8 warm-up steps, then --steps decode steps (step_profile.py's loop and session options). Per op type it prints the
kernels per step, the kernels per layer (per step over the graph's GroupQueryAttention count), and the median over
the repeats of the op type's share of the kernels' summed time (smallest and largest beside it). Shares move far
less with the machine's load than absolute times do; the ms column is there to rank, not to quote.

Below the table: the weight products' share (MatMulNBits, MatMul, QGemm, DynamicQuantizeMatMul, Gemm), and the
kernels' sum against the profiled step's wall time: the rest is onnxruntime's own work between kernels and the
Python that feeds the step.
"""

import argparse
import os
import tempfile
from pathlib import Path

import numpy as np
import onnxruntime as ort
from step_profile import make_session, op_table, run_steps  # benchmarks/ is on the path of its own scripts

PRODUCTS = {"MatMulNBits", "MatMul", "QGemm", "DynamicQuantizeMatMul", "Gemm", "MatMulInteger", "FusedMatMul"}


def profile_once(model_file: Path, threads: int, options: dict, past: int, steps: int, seed: int):
    """One fresh profiled session: (op type -> (kernels per step, ms per step), the median step's wall ms)."""
    with tempfile.TemporaryDirectory() as folder:
        session = make_session(model_file, threads, options, folder)
        step_ms = run_steps(session, past, steps, np.random.default_rng(seed))
        return op_table(session.end_profiling(), steps), step_ms


def op_shares(package: Path, threads: int, options: dict, past: int, steps: int, repeats: int) -> dict:
    """{"ops": op type -> (kernels per step, ms per step median, [share per repeat]), "layers", "step_ms",
    "kernels_ms", "products"}: per repeat's shares of the kernels' summed time."""
    runs = [profile_once(package / "model.onnx", threads, options, past, steps, seed) for seed in range(repeats)]
    ops = sorted({op for table, _ in runs for op in table})
    totals = [sum(ms for _, ms in table.values()) for table, _ in runs]
    rows = {}
    for op in ops:
        counts = [table.get(op, (0, 0.0))[0] for table, _ in runs]
        times = [table.get(op, (0, 0.0))[1] for table, _ in runs]
        rows[op] = (float(np.median(counts)), float(np.median(times)), [t / s for t, s in zip(times, totals)])
    layers = max(1, round(rows.get("GroupQueryAttention", (1, 0, []))[0]))
    products = [sum(rows[op][2][i] for op in ops if op in PRODUCTS) for i in range(repeats)]
    return {
        "ops": rows,
        "layers": layers,
        "step_ms": float(np.median([s for _, s in runs])),
        "kernels_ms": float(np.median(totals)),
        "products": products,
    }


def print_table(name: str, threads: int, result: dict) -> None:
    rows, layers = result["ops"], result["layers"]
    step, kernels = result["step_ms"], result["kernels_ms"]
    print(f"\n{name}, {threads} thread(s), {layers} layers: profiled step {step:.3f} ms, kernels' sum {kernels:.3f} ms")
    print("| op | kernels/step | per layer | ms/step | share (median) | min-max |")
    print("| --- | ---: | ---: | ---: | ---: | --- |")
    for op, (count, ms, shares) in sorted(rows.items(), key=lambda item: -np.median(item[1][2])):
        low, high = 100 * min(shares), 100 * max(shares)
        print(
            f"| {op} | {count:.0f} | {count / layers:.2f} | {ms:.3f} | {100 * np.median(shares):.1f}% "
            f"| {low:.1f}-{high:.1f}% |"
        )
    products = result["products"]
    print(
        f"weight products {100 * np.median(products):.1f}% of the kernels ({100 * min(products):.1f}-"
        f"{100 * max(products):.1f}%); kernels' sum {100 * kernels / step:.0f}% of the profiled step; "
        f"{sum(c for c, _, _ in rows.values()):.0f} kernels a step"
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("packages", nargs="+", type=Path)
    parser.add_argument("--threads", default="2")
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--past", type=int, default=8, help="positions in the cache before the timed steps")
    parser.add_argument("--option", action="append", default=[], help="KEY=VALUE session config entry")
    args = parser.parse_args()
    options = dict(option.split("=", 1) for option in args.option)
    print(f"load average {os.getloadavg()[0]:.2f}, onnxruntime {ort.__version__}, options {options or 'none'}")
    for package in args.packages:
        for threads in (int(t) for t in args.threads.split(",")):
            result = op_shares(package, threads, options, args.past, args.steps, args.repeats)
            print_table(package.name, threads, result)
    print(f"\nload average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
