"""Each op type's share of a decode step, and its count per layer: medians over repeated profiles.

    python benchmarks/op_share.py PKG [PKG ...] [--threads 2] [--steps 32] [--repeats 3] [--past 8]
    python benchmarks/op_share.py PKG --option session.intra_op.allow_spinning=0
    python benchmarks/op_share.py PKG --batch 1,8,16     # rows decoding together, the cache written in place

For each package, --repeats times: a fresh session with onnxruntime's profiler on, a prompt of --past positions,
8 warm-up steps, then --steps decode steps (step_profile.py's loop and session options). Per op type it prints the
kernels per step, the kernels per layer (per step over the graph's GroupQueryAttention count), and its share of
each step's kernel time: the median over every profiled step, and beside it the smallest and largest of the
repeats' own medians. Shares move far less with the machine's load than absolute times do, and a step the machine
preempted moves its own shares, not the medians; the ms column is there to rank, not to quote.

The LM head's kernels (the nodes between the final norm and `logits`) are rows of their own, "LM head <op>".
Below the table: the weight products' share (MatMulNBits, MatMul, QGemm, DynamicQuantizeMatMul, Gemm, the head's
included), and the kernels' sum over onnxruntime's own run time (its model_run events): the rest is onnxruntime's
work between kernels. The profiled step's wall time above the table adds the Python that feeds each step.

Without --batch, one row and each step's present fed back as the next past; with --batch N[,N...], each batch size
in turn, N rows at the same cache length, the cache fed in place as the runtime feeds it (step_profile.py's
in_place_steps), and each table's title gives the step's ms per token too.
"""

import argparse
import bisect
import json
import os
import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from step_profile import make_session, run_steps  # benchmarks/ is on the path of its own scripts

PRODUCTS = {
    "MatMulNBits",
    "MatMul",
    "QGemm",
    "DynamicQuantizeMatMul",
    "Gemm",
    "MatMulInteger",
    "MatMulIntegerToFloat",
    "FusedMatMul",
}


def head_nodes(model_file: Path) -> set:
    """The names of the nodes between the final norm and `logits` (the LM head), as the package's graph names
    them (onnxruntime keeps a node's name unless it fuses it into another)."""
    graph = onnx.load(str(model_file), load_external_data=False).graph
    producer = {out: node for node in graph.node for out in node.output}
    names, waiting = set(), ["logits"]
    while waiting:
        node = producer.get(waiting.pop())
        if node is None or node.name in names or node.op_type.endswith("Normalization"):
            continue
        names.add(node.name)
        waiting += list(node.input)
    return names


def op_table(profile_file: str, steps: int, head: set) -> list[tuple[dict, float]]:
    """For each of the last `steps` runs of the profile: (op type -> (kernels, ms), onnxruntime's run ms). The LM
    head's kernels are counted apart, as "LM head <op type>"."""
    events = json.loads(Path(profile_file).read_text())
    runs = sorted((e["ts"], e["dur"]) for e in events if e.get("cat") == "Session" and e.get("name") == "model_run")
    runs = runs[-steps:]
    starts = [ts for ts, _ in runs]
    tables = [defaultdict(lambda: [0, 0.0]) for _ in runs]
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time") and event["ts"] >= starts[0]:
            op = event["args"]["op_name"]
            row = tables[bisect.bisect_right(starts, event["ts"]) - 1][
                f"LM head {op}" if event["name"].removesuffix("_kernel_time") in head else op
            ]
            row[0] += 1
            row[1] += event["dur"] / 1000
    return [({op: tuple(v) for op, v in table.items()}, dur / 1000) for table, (_, dur) in zip(tables, runs)]


def profile_once(
    model_file: Path, threads: int, options: dict, past: int, steps: int, seed: int, head: set, batch=None
):
    """One fresh profiled session: (op_table's runs, the median step's wall ms). batch: run_steps' (None: one row,
    the cache fed back)."""
    with tempfile.TemporaryDirectory() as folder:
        session = make_session(model_file, threads, options, folder)
        step_ms = run_steps(session, past, steps, np.random.default_rng(seed), batch=batch)
        return op_table(session.end_profiling(), steps, head), step_ms


def op_shares(package: Path, threads: int, options: dict, past: int, steps: int, repeats: int, batch=None) -> dict:
    """Per op type: kernels a step, the median ms a step, and its share of each step's kernel time, as the median
    over every profiled step and per repeat (the median of that repeat's steps). A step the machine preempted
    moves its own shares, not the medians. Also per repeat: the weight products' share, and the kernels' sum
    over onnxruntime's run time."""
    head = head_nodes(package / "model.onnx")
    model_file = package / "model.onnx"
    measured = [profile_once(model_file, threads, options, past, steps, s, head, batch) for s in range(repeats)]
    repeats_steps = [[table for table, _ in runs] for runs, _ in measured]  # [repeat][step] op -> (kernels, ms)

    def kernels(table):
        return sum(ms for _, ms in table.values())

    def medians(share):  # share(table) -> float: (over every step, [per repeat])
        every = float(np.median([share(t) for tables in repeats_steps for t in tables]))
        return every, [float(np.median([share(t) for t in tables])) for tables in repeats_steps]

    rows = {}
    for op in sorted({op for tables in repeats_steps for table in tables for op in table}):
        counts = [t.get(op, (0, 0.0))[0] for tables in repeats_steps for t in tables]
        times = [t.get(op, (0, 0.0))[1] for tables in repeats_steps for t in tables]
        share, per_repeat = medians(lambda t, op=op: t.get(op, (0, 0.0))[1] / kernels(t))
        rows[op] = (float(np.median(counts)), float(np.median(times)), share, per_repeat)

    def in_products(table):
        return sum(ms for op, (_, ms) in table.items() if op.removeprefix("LM head ") in PRODUCTS)

    in_kernels = [float(np.median([kernels(t) / run_ms for t, run_ms in runs])) for runs, _ in measured]
    return {
        "ops": rows,
        "layers": max(1, round(rows.get("GroupQueryAttention", (1,))[0])),
        "step_ms": float(np.median([step for _, step in measured])),
        "kernels_ms": float(np.median([kernels(t) for tables in repeats_steps for t in tables])),
        "products": medians(lambda t: in_products(t) / kernels(t))[1],
        "in_kernels": in_kernels,
    }


def print_table(name: str, threads: int, result: dict, batch=None) -> None:
    rows, layers = result["ops"], result["layers"]
    step, kernels = result["step_ms"], result["kernels_ms"]
    rows_note = "" if batch is None else f", batch {batch} ({step / batch:.3f} ms a token)"
    print(
        f"\n{name}, {threads} thread(s){rows_note}, {layers} layers: profiled step {step:.3f} ms, "
        f"kernels' sum {kernels:.3f} ms"
    )
    print("| op | kernels/step | per layer | ms/step | share (median) | repeats' medians |")
    print("| --- | ---: | ---: | ---: | ---: | --- |")
    for op, (count, ms, share, shares) in sorted(rows.items(), key=lambda item: -item[1][2]):
        low, high = 100 * min(shares), 100 * max(shares)
        print(f"| {op} | {count:.0f} | {count / layers:.2f} | {ms:.3f} | {100 * share:.1f}% | {low:.1f}-{high:.1f}% |")
    products, in_kernels = result["products"], result["in_kernels"]
    print(
        f"weight products (LM head included) {100 * np.median(products):.1f}% of the kernels "
        f"({100 * min(products):.1f}-{100 * max(products):.1f}%); the kernels' sum "
        f"{100 * np.median(in_kernels):.0f}% of onnxruntime's run ({100 * min(in_kernels):.0f}-"
        f"{100 * max(in_kernels):.0f}%); {sum(row[0] for row in rows.values()):.0f} kernels a step"
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("packages", nargs="+", type=Path)
    parser.add_argument("--threads", default="2")
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--past", type=int, default=8, help="positions in the cache before the timed steps")
    parser.add_argument("--option", action="append", default=[], help="KEY=VALUE session config entry")
    parser.add_argument("--batch", help="N[,N...]: rows decoding together, the cache written in place")
    args = parser.parse_args()
    options = dict(option.split("=", 1) for option in args.option)
    batches = [None] if args.batch is None else [int(b) for b in args.batch.split(",")]
    if any(b is not None and b < 1 for b in batches):
        parser.error("--batch takes row counts of 1 or more")
    print(f"load average {os.getloadavg()[0]:.2f}, onnxruntime {ort.__version__}, options {options or 'none'}")
    for package in args.packages:
        for threads in (int(t) for t in args.threads.split(",")):
            for batch in batches:
                result = op_shares(package, threads, options, args.past, args.steps, args.repeats, batch)
                print_table(package.name, threads, result, batch)
    print(f"\nload average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
