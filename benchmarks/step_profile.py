"""Where one decode step goes, op type by op type: onnxruntime's profiler over a package's own graph.

    python benchmarks/step_profile.py PKG [PKG ...] --threads 1,2 [--steps 64] [--past 8]
    python benchmarks/step_profile.py PKG --option session.intra_op.allow_spinning=0
    python benchmarks/step_profile.py PKG-A PKG-B --rounds 7 --threads 2    # no profile: A/B step times
    python benchmarks/step_profile.py PKG PKG::session.intra_op.allow_spinning=0 --rounds 5   # one package, two settings
    python benchmarks/step_profile.py PKG --threads 2 --batch 1,8,16    # rows decoding together, the cache in place
    python benchmarks/step_profile.py PKG VARIANT::custom_ops=LIB --rounds 7 --threads 2   # LIB registered for VARIANT

Runs the package's graph directly (the session options of runtime/engine/session.py: extended
optimizations, inter-op 1, the given intra-op threads, plus each --option as a session config entry) at
batch 1: a prompt of --past positions, then --steps decode steps feeding the cache back, after 8 warm-up
steps (`custom_ops=LIB`, as an --option or after a package, registers the custom-op library LIB instead, for a
graph of tools/graph_variants.py's custom-int8). Prints, per package and thread count, the step's wall time with the profiler off and on, and per op
type: kernels per step, ms per step (the kernels' own time summed over the steps, divided by them) and its
share of the kernels' total. With --rounds N no profile is taken: every package's session is made once and
the packages take turns, N rounds of --steps steps each, and the medians of each round's median step are
printed with each package's ratio to the first (its step time over theirs: above 1 is faster), then, without
--batch, the same for the prompt pass of --past positions that opens each round. The graph's own token lookup is fed ids; a graph that takes inputs_embeds (a
tied int8 head, looked up by the runtime) is fed random rows: the products' cost does not depend on values.

With --batch N[,N...] each batch size is run in turn: N rows decode together, every row at the same cache length,
and the cache is fed as the runtime feeds an edgelm package's (runtime/engine/decode.py's InPlaceDecoder): one
[N, heads, positions, head_size] buffer per cache tensor, bound as both past and present so GroupQueryAttention
writes each step's rows in place, and the last position's logits only, into one preallocated [N, 1, vocab] array.
A profiled step's table gives its time per row beside it (ms a token). Without --batch: batch 1, each step's
present fed back as the next past. PKG::KEY=VALUE applies to the profiled tables too.
"""

import argparse
import json
import os
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import onnxruntime as ort

WARMUP = 8


def make_session(model_file: Path, threads: int, options: dict, profile_dir: str | None) -> ort.InferenceSession:
    settings = ort.SessionOptions()
    settings.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    settings.log_severity_level = 4
    settings.intra_op_num_threads, settings.inter_op_num_threads = threads, 1
    for key, value in options.items():
        if key == "custom_ops":  # a custom-op library (benchmarks/custom_op/), not a config entry
            settings.register_custom_ops_library(value)
        else:
            settings.add_session_config_entry(key, value)
    if profile_dir:
        settings.enable_profiling = True
        settings.profile_file_prefix = os.path.join(profile_dir, "step")
    return ort.InferenceSession(str(model_file), sess_options=settings, providers=["CPUExecutionProvider"])


def feeds_for(session: ort.InferenceSession, past: dict, length: int, position: int, rng, batch: int = 1) -> dict:
    """One step's inputs for `batch` rows: `length` new positions after `position` cached ones; past: the
    present.* of the last (rows not in it are left out: an in-place cache is bound apart)."""
    feeds = {}
    for value in session.get_inputs():
        name = value.name
        if name == "input_ids":
            feeds[name] = rng.integers(0, 1000, size=(batch, length), dtype=np.int64)
        elif name == "inputs_embeds":
            feeds[name] = rng.standard_normal((batch, length, value.shape[2]), dtype=np.float32)
        elif name == "attention_mask":
            feeds[name] = np.ones((batch, position + length), np.int64)
        elif name == "position_ids":
            feeds[name] = np.repeat(np.arange(position, position + length, dtype=np.int64)[None], batch, axis=0)
        elif name.startswith("past_key_values.") and name in past:
            feeds[name] = past[name]
    if "logits_to_keep" in {value.name for value in session.get_overridable_initializers()}:
        feeds["logits_to_keep"] = np.array(1, np.int64)  # as the runtime: the last position's logits only
    return feeds


def run_steps(session, past_length: int, steps: int, rng, cpu: list | None = None, batch: int | None = None,
              prompt: list | None = None) -> float:  # fmt: skip
    """Prompt, WARMUP steps, then `steps` timed steps; returns the median step in ms. cpu, if given, gets the
    process's CPU ms per timed step (all threads; with 1 thread the step's own work, spinning aside). batch: that
    many rows, the cache written in place (in_place_steps); None: one row, the present fed back as the past, and
    `prompt`, if given, gets the prompt pass's ms."""
    if batch is not None:
        return in_place_steps(session, past_length, steps, rng, batch, cpu)
    cache_inputs = [v for v in session.get_inputs() if v.name.startswith("past_key_values.")]
    dtype = {"tensor(float)": np.float32, "tensor(int8)": np.int8, "tensor(float16)": np.float16}
    past = {v.name: np.zeros((1, v.shape[1], 0, v.shape[3]), dtype[v.type]) for v in cache_inputs}
    outputs = [o.name for o in session.get_outputs()]
    position, length, times = 0, past_length, []
    for step in range(WARMUP + steps + 1):
        if step == WARMUP + 1:
            cpu_started = time.process_time()
        feeds = feeds_for(session, past, length, position, rng)  # made outside the timed run, as in_place_steps does
        started = time.perf_counter()
        result = session.run(outputs, feeds)
        if step > WARMUP:
            times.append(time.perf_counter() - started)
        elif step == 0 and prompt is not None:
            prompt.append(1000 * (time.perf_counter() - started))
        named = dict(zip(outputs, result))
        past = {v.name: named["present." + v.name.removeprefix("past_key_values.")] for v in cache_inputs}
        position, length = position + length, 1
    if cpu is not None:
        cpu.append(1000 * (time.process_time() - cpu_started) / steps)
    return 1000 * float(np.median(times))


CACHE_TYPES = {"tensor(float)": np.float32, "tensor(int8)": np.int8, "tensor(float16)": np.float16}


def in_place_steps(session, past_length: int, steps: int, rng, batch: int, cpu: list | None = None) -> float:
    """run_steps for `batch` rows at the same cache length, fed as InPlaceDecoder feeds them: one buffer per cache
    tensor bound as both its past and its present, logits_to_keep 1, the logits into one preallocated array."""
    cache_inputs = [v for v in session.get_inputs() if v.name.startswith("past_key_values.")]
    capacity = past_length + WARMUP + steps + 1
    binding, keep = session.io_binding(), {}  # keep: the arrays the binding's OrtValues borrow
    for v in cache_inputs:
        keep[v.name] = np.zeros((batch, v.shape[1], capacity, v.shape[3]), CACHE_TYPES[v.type])
        value = ort.OrtValue.ortvalue_from_numpy(keep[v.name])
        binding.bind_ortvalue_input(v.name, value)
        binding.bind_ortvalue_output("present." + v.name.removeprefix("past_key_values."), value)
    vocab = next(o.shape[-1] for o in session.get_outputs() if o.name == "logits")
    keep["logits"] = np.zeros((batch, 1, vocab), np.float32)
    binding.bind_ortvalue_output("logits", ort.OrtValue.ortvalue_from_numpy(keep["logits"]))
    keep["logits_to_keep"] = np.array(1, dtype=np.int64)
    binding.bind_ortvalue_input("logits_to_keep", ort.OrtValue.ortvalue_from_numpy(keep["logits_to_keep"]))
    position, length, times = 0, past_length, []
    for step in range(WARMUP + steps + 1):
        if step == WARMUP + 1:
            cpu_started = time.process_time()
        feeds = feeds_for(session, {}, length, position, rng, batch)
        feeds.pop("logits_to_keep", None)  # bound above, once
        started = time.perf_counter()
        for name, array in feeds.items():
            binding.bind_cpu_input(name, array)
        session.run_with_iobinding(binding)
        if step > WARMUP:
            times.append(time.perf_counter() - started)
        position, length = position + length, 1
    if cpu is not None:
        cpu.append(1000 * (time.process_time() - cpu_started) / steps)
    return 1000 * float(np.median(times))


def op_table(profile_file: str, steps: int) -> dict:
    """op type -> (kernels per step, ms per step) over the last `steps` runs of the profile."""
    events = json.loads(Path(profile_file).read_text())
    runs = sorted(e["ts"] for e in events if e.get("cat") == "Session" and e.get("name") == "model_run")
    start = runs[-steps]
    per_op = defaultdict(lambda: [0, 0.0])
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time") and event["ts"] >= start:
            row = per_op[event["args"]["op_name"]]
            row[0] += 1
            row[1] += event["dur"] / 1000
    return {op: (count / steps, ms / steps) for op, (count, ms) in per_op.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("packages", nargs="+", help="package folders; PKG::KEY=VALUE adds a config entry to one")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--past", type=int, default=8, help="positions in the cache before the timed steps")
    parser.add_argument(
        "--option", action="append", default=[], help="KEY=VALUE session config entry; custom_ops=LIB: a library"
    )
    parser.add_argument("--rounds", type=int, default=0, help="no profile: the packages' step times, interleaved")
    parser.add_argument("--batch", help="N[,N...]: rows decoding together, the cache written in place")
    args = parser.parse_args()
    options = dict(option.split("=", 1) for option in args.option)
    args.labels = args.packages
    args.extra = [dict(o.split("=", 1) for o in p.split("::")[1:]) for p in args.packages]
    args.packages = [Path(p.split("::")[0]) for p in args.packages]
    args.batches = [None] if args.batch is None else [int(b) for b in args.batch.split(",")]
    if any(b is not None and b < 1 for b in args.batches):
        parser.error("--batch takes row counts of 1 or more")
    print(f"load average {os.getloadavg()[0]:.2f}, onnxruntime {ort.__version__}, options {options or 'none'}")
    if args.rounds:
        return interleaved(args, options)
    for package, extra in zip(args.packages, args.extra):
        for threads in (int(t) for t in args.threads.split(",")):
            for batch in args.batches:
                rng = np.random.default_rng(0)
                plain = run_steps(
                    make_session(package / "model.onnx", threads, options | extra, None),
                    args.past, args.steps, rng, batch=batch,
                )  # fmt: skip
                with tempfile.TemporaryDirectory() as folder:
                    session = make_session(package / "model.onnx", threads, options | extra, folder)
                    profiled = run_steps(session, args.past, args.steps, rng, batch=batch)
                    table = op_table(session.end_profiling(), args.steps)
                total = sum(ms for _, ms in table.values())
                rows = "" if batch is None else f", batch {batch} ({plain / batch:.3f} ms a token)"
                print(f"\n{package.name}, {threads} thread(s){rows}: step {plain:.3f} ms ({profiled:.3f} ms profiled)")
                print(f"| op | kernels/step | ms/step | share | (kernels' sum {total:.3f} ms) |")
                print("| --- | ---: | ---: | ---: | --- |")
                for op, (count, ms) in sorted(table.items(), key=lambda item: -item[1][1]):
                    print(f"| {op} | {count:.0f} | {ms:.3f} | {100 * ms / total:.1f}% | |")


def shown(label: str) -> str:
    """A package argument as printed: its folder's name, then any ::KEY=VALUE it carries."""
    folder, _, settings = label.partition("::")
    return Path(folder).name + ("::" + settings if settings else "")


def interleaved(args, options) -> None:
    for threads in (int(t) for t in args.threads.split(",")):
        sessions = [
            make_session(package / "model.onnx", threads, options | extra, None)
            for package, extra in zip(args.packages, args.extra)
        ]
        for batch in args.batches:
            steps, cpu, prompts = [[] for _ in sessions], [[] for _ in sessions], [[] for _ in sessions]
            for round_ in range(args.rounds):
                order = list(range(len(sessions)))
                for i in order if round_ % 2 == 0 else order[::-1]:
                    rng = np.random.default_rng(round_)
                    steps[i].append(run_steps(sessions[i], args.past, args.steps, rng, cpu[i], batch, prompts[i]))
            medians, cpu_medians = [float(np.median(s)) for s in steps], [float(np.median(c)) for c in cpu]
            rows = "" if batch is None else f", batch {batch}"
            print(
                f"\n{threads} thread(s){rows}, {args.rounds} rounds of {args.steps} steps, "
                f"load average {os.getloadavg()[0]:.2f}"
            )
            for label, median, c, s in zip(args.labels, medians, cpu_medians, steps):
                rounds = " ".join(f"{x:.2f}" for x in s)
                print(
                    f"{shown(label)}: median step {median:.3f} ms, x{medians[0] / median:.3f} the first; CPU {c:.3f} ms"
                    f" a step, x{cpu_medians[0] / c:.3f} the first per CPU second (rounds' steps: {rounds})"
                )
            for label, p in zip(args.labels, prompts if prompts[0] else []):  # batch 1's prompt passes
                print(
                    f"{shown(label)}: prompt of {args.past} positions {np.median(p):.2f} ms,"
                    f" x{np.median(prompts[0]) / np.median(p):.3f} the first"
                    f" (rounds: {' '.join(f'{x:.1f}' for x in p)})"
                )


if __name__ == "__main__":
    main()
