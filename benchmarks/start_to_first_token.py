"""Process start to first token of `edgelm generate`, the commands taking turns round by round.

    python benchmarks/start_to_first_token.py PKG [--bundle DIR/edgelm/edgelm] [--rounds 9]

Each command is `edgelm generate -m PKG "Hello" --max-new-tokens 1`, timed from its start to its exit (the first
token is its last act): with the package's files checked against the record of the last full check (the
default), with --verify (every file hashed again), and, given --bundle, the frozen command of `edgelm bundle`.
Printed: the median and the range over the rounds, per command, and the median CPU time (user + system) of
the process, which a busy machine changes less than the time. The first round is a warm-up, not counted.
"""

import argparse
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package")
    parser.add_argument("--bundle", help="the frozen edgelm of a bundle")
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    edgelm = shutil.which("edgelm", path=str(Path(sys.executable).parent)) or "edgelm"
    tail = ["generate", "-m", args.package, "Hello", "--max-new-tokens", "1"]
    commands = {"edgelm generate": [edgelm, *tail], "edgelm generate --verify": [edgelm, *tail, "--verify"]}
    if args.bundle:
        commands["bundle's edgelm generate"] = [args.bundle, *tail]
    times = {name: [] for name in commands}
    cpu = {name: [] for name in commands}
    for round_ in range(args.rounds + 1):
        for name, command in commands.items():
            before, started = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
            subprocess.run(command, check=True, capture_output=True)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            if round_:
                times[name].append(time.perf_counter() - started)
                cpu[name].append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    for name, seconds in times.items():
        print(
            f"{name:28} median {statistics.median(seconds):.3f} s  (min {min(seconds):.3f}, max {max(seconds):.3f}); "
            f"CPU time {statistics.median(cpu[name]):.3f} s"
        )


if __name__ == "__main__":
    main()
