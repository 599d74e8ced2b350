"""Where the start to the first token goes, stage by stage, each in a fresh process, two checkouts taking turns.

    python benchmarks/start_stages.py PKG [--base CHECKOUT] [--rounds 10] [--verify full]
    python benchmarks/start_stages.py PKG --levels [--rounds 10]

Each round starts one process per checkout (this one, and --base CHECKOUT's, alternating which goes first) that
times with time.perf_counter, from its first line on: the imports of numpy, onnxruntime and tokenizers, then
edgelm's API (edgelm.runtime.model), then the `edgelm` command's own modules (cli.main: click and the options),
then `load(PKG)` taken apart by wrapping the functions it calls (opening the package: the manifest, the
checksums against the record of the last full check, the graph scan; the tokenizer; the onnxruntime version
check; the session; the rest of the load; where the checkout builds the tokenizer while a thread creates the
session, that stage as a whole, and inside it the four before, which overlap and are left out of the sums; where
the checkout starts the session's thread before it imports the Model's modules (model/session_start.py), the
stage runs from the thread's start to the tokenizer and session made, those imports inside it), then the first
`generate(..., max_new_tokens=1)` and a second one (so the first call's own cost shows). The parent also times
each process from its start to its exit ("process").
Printed: per stage, the median over the rounds (the first round a warm-up, not counted) of its time and of the
process's CPU time in it (time.process_time: every thread's, which a busy machine changes less than the time),
with the load average at the start and the end: on a shared machine only the columns of one run compare.

--base CHECKOUT runs another checkout of edgelm (`git worktree add --detach DIR COMMIT`) with this interpreter
and its packages, as start_to_first_token.py does; without it only this checkout runs.

--levels times, instead, onnxruntime's session creation alone at each graph optimization level (edgelm's other
session options), each in a fresh process, the levels taking turns, with the package's graph and 16 steps of
one token run through the plain InferenceSession.run after it: whether a lower level would start faster, and
what the steps would pay for it.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from start_to_first_token import base_path  # noqa: E402

# The child: stage timings of one start, printed as one JSON line. Functions are wrapped wherever a module of
# edgelm.runtime holds them, so the split does not depend on which module calls them.
CHILD = r"""
import time
t0, c0 = time.perf_counter(), time.process_time()
import json, sys
stages, cpu, mark = {}, {}, [t0, c0]
def lap(name):
    now, now_cpu = time.perf_counter(), time.process_time()
    stages[name], cpu[name] = now - mark[0], now_cpu - mark[1]
    mark[:] = now, now_cpu
import numpy; lap("import numpy")
import onnxruntime; lap("import onnxruntime")
import tokenizers; lap("import tokenizers")
import edgelm.runtime.model as api; lap("import edgelm.runtime.model")
import edgelm.runtime.cli.main; lap("import edgelm.runtime.cli.main")
WRAPPED = {  # function name -> stage
    "resolve_package": "load: resolve the package",
    "read_manifest": "load: read the manifest",
    "verify_files": "load: checksums",
    "scan_model": "load: scan the graph",
    "tokenizer_and_session": "load: tokenizer and session, at once",
    "tokenizer_text": "load: read tokenizer.json",
    "load_tokenizer": "load: build the tokenizer",
    "check_installed": "load: onnxruntime check",
    "create_session": "load: create the session",
    "check_graph_shapes": "load: graph shapes, names",
    "graph_io": "load: graph shapes, names",
    "from_package": "load: chat template",
    "release_freed_memory": "load: malloc_trim, drop mapped pages",
    "drop_mapped_pages": "load: malloc_trim, drop mapped pages",
}
spent = {stage: [0.0, 0.0] for stage in WRAPPED.values()}
AT_ONCE = "tokenizer_and_session"  # a checkout that builds the two one after the other has no such function
START = "start_session"  # a checkout that starts the session's thread before the Model's imports: the stage's start
WRAPPED[START] = WRAPPED[AT_ONCE]
INSIDE = [WRAPPED[n] for n in ("tokenizer_text", "load_tokenizer", "check_installed", "create_session")]
at_once = []  # while the tokenizer and the session are being made at once: when (time, CPU) that stage began
def timed(function, stage):
    def wrapper(*args, **kwargs):
        if at_once and stage not in INSIDE and function.__name__ != AT_ONCE:  # e.g. a malloc_trim inside it
            return function(*args, **kwargs)
        started, started_cpu = time.perf_counter(), time.process_time()
        if function.__name__ == START or (stage == WRAPPED[AT_ONCE] and not at_once):
            at_once[:] = started, started_cpu
        try:
            return function(*args, **kwargs)
        finally:
            if function.__name__ == AT_ONCE:  # the stage ends with the tokenizer and the session made
                spent[stage][0] += time.perf_counter() - at_once[0]
                spent[stage][1] += time.process_time() - at_once[1]
                at_once.clear()
            elif function.__name__ != START:
                spent[stage][0] += time.perf_counter() - started
                spent[stage][1] += time.process_time() - started_cpu
    return wrapper
from edgelm.runtime.package.open import Package
from edgelm.runtime.text.chat_template import ChatTemplate
READ = "tokenizer_data" if hasattr(Package, "tokenizer_data") else "tokenizer_text"  # what the load reads it with
setattr(Package, READ, timed(getattr(Package, READ), WRAPPED["tokenizer_text"]))
ChatTemplate.from_package = classmethod(timed(ChatTemplate.from_package.__func__, WRAPPED["from_package"]))
found = {"tokenizer_text", "from_package"}
for module in list(sys.modules.values()):  # a function is wrapped wherever a module of edgelm.runtime holds it
    if getattr(module, "__name__", "").startswith("edgelm.runtime"):
        for name, stage in WRAPPED.items():
            function = getattr(module, name, None)
            if callable(function) and not hasattr(function, "__wrapped_stage__"):
                wrapper = timed(function, stage)
                wrapper.__wrapped_stage__ = stage
                setattr(module, name, wrapper)
                found.add(name)
if set(WRAPPED) - found - {AT_ONCE, START}:
    sys.exit(f"not found in edgelm.runtime: {sorted(set(WRAPPED) - found - {AT_ONCE, START})}")
if AT_ONCE not in found:
    del spent[WRAPPED[AT_ONCE]]
outer = [stage for stage in spent if AT_ONCE not in found or stage not in INSIDE]
mark[:] = time.perf_counter(), time.process_time()
model = api.load(sys.argv[1], verify="full" if sys.argv[2] == "full" else True)
lap("load")
stages["load: the rest"] = stages.pop("load") - sum(spent[stage][0] for stage in outer)
cpu["load: the rest"] = cpu.pop("load") - sum(spent[stage][1] for stage in outer)
for stage, (wall, used) in spent.items():
    stages[stage], cpu[stage] = wall, used
mark[:] = time.perf_counter(), time.process_time()
model.generate("Hello", max_new_tokens=1); lap("first generate, 1 token")
model.generate("Hello", max_new_tokens=1); lap("second generate, 1 token")
counted = [k for k in stages if not k.startswith("second") and (AT_ONCE not in found or k not in INSIDE)]
stages["in process, to the first token"] = sum(stages[k] for k in counted)
cpu["in process, to the first token"] = sum(cpu[k] for k in counted)
print(json.dumps({"wall": stages, "cpu": cpu}))
"""


# The child of --levels: seconds (wall, CPU) to create the session at one level, and the median of 16 one-token
# steps (a past of 8 zero positions; nothing of edgelm imported).
LEVEL_CHILD = r"""
import json, statistics, sys, time
import numpy as np, onnxruntime as ort
options = ort.SessionOptions()
options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, sys.argv[2])
options.log_severity_level, options.inter_op_num_threads = 4, 1
started, started_cpu = time.perf_counter(), time.process_time()
session = ort.InferenceSession(sys.argv[1] + "/model.onnx", sess_options=options, providers=["CPUExecutionProvider"])
created, created_cpu = time.perf_counter() - started, time.process_time() - started_cpu
feed, past = {}, 8
types = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int8)": np.int8}
for i in session.get_inputs():
    if i.name.startswith("past_key_values"):  # [batch, kv_heads, past, head_size]
        feed[i.name] = np.zeros((1, i.shape[1], past, i.shape[3]), types[i.type])
    elif i.name == "attention_mask":
        feed[i.name] = np.ones((1, past + 1), np.int64)
    elif i.name == "position_ids":
        feed[i.name] = np.full((1, 1), past, np.int64)
    elif i.name == "input_ids":
        feed[i.name] = np.full((1, 1), 464, np.int64)
    elif i.name == "inputs_embeds":
        feed[i.name] = np.zeros((1, 1, i.shape[-1]), np.float32)
steps = []
for _ in range(17):
    t = time.perf_counter(); session.run(["logits"], feed); steps.append(time.perf_counter() - t)
print(json.dumps([created, created_cpu, statistics.median(steps[1:])]))
"""
LEVELS = ("ORT_DISABLE_ALL", "ORT_ENABLE_BASIC", "ORT_ENABLE_EXTENDED")


def levels(package: str, rounds: int) -> None:
    found = {level: [] for level in LEVELS}
    before = load_average()
    for round_ in range(rounds + 1):
        for level in LEVELS if round_ % 2 else reversed(LEVELS):
            done = subprocess.run([sys.executable, "-c", LEVEL_CHILD, package, level], capture_output=True, text=True)
            if done.returncode:
                sys.exit(f"{level}: {done.stderr.strip()[-300:]}")
            if round_:
                found[level].append(json.loads(done.stdout))
    print(f"{rounds} rounds, medians; load average {before} before, {load_average()} after")
    print("| level | session created (wall / CPU) | one-token step |")
    print("| --- | ---: | ---: |")
    for level, runs in found.items():
        wall, cpu, step = (statistics.median(r[i] for r in runs) * 1000 for i in range(3))
        print(f"| {level} | {wall:.1f} / {cpu:.1f} ms | {step:.2f} ms |")


def load_average() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package")
    parser.add_argument("--base", type=Path, help="another checkout of edgelm, run with this interpreter")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--verify", choices=("record", "full"), default="record")
    parser.add_argument("--levels", action="store_true", help="time the session at each optimization level")
    args = parser.parse_args()
    if args.levels:
        return levels(args.package, args.rounds)
    environ = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    scratch = tempfile.TemporaryDirectory()
    runs = {"this": environ}
    if args.base:
        runs = {"base": {**environ, "PYTHONPATH": base_path(args.base, Path(scratch.name))}, **runs}
    command = [sys.executable, "-c", CHILD, args.package, args.verify]
    results = {name: [] for name in runs}
    before = load_average()
    for round_ in range(args.rounds + 1):
        order = list(runs) if round_ % 2 else list(reversed(runs))  # alternate which goes first
        for name in order:
            started = time.perf_counter()
            done = subprocess.run(command, capture_output=True, text=True, env=runs[name])
            process = time.perf_counter() - started
            if done.returncode:
                sys.exit(f"{name}: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done.returncode}")
            if round_:
                child = json.loads(done.stdout.splitlines()[-1])
                results[name].append({"wall": {**child["wall"], "process, to its exit": process}, "cpu": child["cpu"]})
    scratch.cleanup()
    stages = list(dict.fromkeys(stage for name in runs for stage in results[name][0]["wall"]))
    print(f"{args.rounds} rounds, medians in ms (wall / CPU); load average {before} before, {load_average()} after")
    print(f"| stage | {' | '.join(runs)} |")
    print(f"| --- |{' ---: |' * len(runs)}")
    for stage in stages:
        cells = []
        for name in runs:
            if stage not in results[name][0]["wall"]:  # a stage of the other checkout's load only
                cells.append("")
                continue
            wall = statistics.median(r["wall"][stage] for r in results[name]) * 1000
            used = [r["cpu"][stage] for r in results[name] if stage in r["cpu"]]
            cells.append(f"{wall:.1f} / {statistics.median(used) * 1000:.1f}" if used else f"{wall:.1f}")
        print(f"| {stage} | {' | '.join(cells)} |")

if __name__ == "__main__":
    main()
