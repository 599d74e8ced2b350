"""The CPU onnxruntime's workers spend after a decode step has returned: what the runtime's spin setting bounds.

    python benchmarks/spin_after_run.py PKG [--batch 16] [--idle 0.5]

For each setting, a process of its own loads PKG (2 threads), decodes a few greedy steps of --batch rows, then
sleeps --idle seconds and prints the CPU time every thread other than the main one spent meanwhile: with
onnxruntime's own spin (the session entry `session.intra_op.spin_duration_us` left out) and with the runtime's
(`engine/session.SPIN_US`). The CPU times are the kernel's per-thread accounting (clock ticks, usually 10 ms).
Linux only: it reads /proc/self/task.
"""

import argparse
import json
import os
import subprocess
import sys
import time


def thread_ticks() -> dict:
    """{thread id: user + system clock ticks} of this process's threads."""
    ticks = {}
    for task in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{task}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        ticks[task] = int(fields[11]) + int(fields[12])
    return ticks


def measure(package: str, batch: int, idle: float, default: bool) -> dict:
    import onnxruntime as ort

    if default:  # onnxruntime's own spin: the runtime's entry is not passed on
        add = ort.SessionOptions.add_session_config_entry
        ort.SessionOptions.add_session_config_entry = lambda self, key, value: (
            None if key == "session.intra_op.spin_duration_us" else add(self, key, value)
        )
    from edgelm.runtime import load
    from edgelm.runtime.apps.bench import exact_decode, prompt_ids

    model = load(package, threads=2)
    steps = exact_decode(model, [prompt_ids(model, 8, seed=r) for r in range(batch)], 8)
    for _ in steps:
        pass
    main = str(os.getpid())
    before = thread_ticks()
    time.sleep(idle)
    after = thread_ticks()
    spent = sum(after[t] - before.get(t, 0) for t in after if t != main)
    return {"spin": "onnxruntime's default" if default else "the runtime's", "batch": batch, "idle s": idle,
            "CPU ms of the other threads": round(spent * 1000 / os.sysconf("SC_CLK_TCK"))}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("package")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--idle", type=float, default=0.5)
    parser.add_argument("--default", action="store_true", help=argparse.SUPPRESS)  # the child of one setting
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.package, args.batch, args.idle, args.default)))
        return
    for default in (True, False):
        command = [sys.executable, __file__, args.package, "--batch", str(args.batch), "--idle", str(args.idle)]
        subprocess.run(command + ["--child"] + (["--default"] if default else []), check=True)


if __name__ == "__main__":
    main()
