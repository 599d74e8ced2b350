"""The continuous-batching scheduler alone (no HTTP, no clients): first-token times of a burst of requests.

    python benchmarks/scheduler_burst.py [PACKAGE] [--rounds 4] [--burst 4] [--max-tokens 48] [--gap-ms 2]

Each round sends one request to an idle scheduler (its time to first token is the "alone" figure), then a burst:
--burst requests --gap-ms apart, as clients whose previous answers ended at the same step send their next ones.
Every request is greedy with ignore_eos from a short prompt (benchmarks/server_load.py's), so each costs
--max-tokens steps. Prints the alone and burst first-token medians, their ratio and the burst's worst: what
benchmarks/server_load.py measures at 4 clients, without the event loop, the HTTP parsing and the clients'
own CPU on top. A benchmark, not a test: nothing is asserted.
"""

import argparse
import os
import statistics
import threading
import time

from edgelm.runtime import load
from edgelm.runtime.batching.scheduler import Scheduler

PROMPTS = ["Hello, my name is", "The quick brown fox", "Once upon a time", "In the beginning", "import numpy as np"]


class Job:
    """The scheduler's job interface (runtime/batching/scheduler.py), noting when its first text piece came."""

    def __init__(self, batch):
        self.batch, self.first, self.error = batch, None, None
        self.ended = threading.Event()

    def start(self):
        pass

    def check(self):
        pass

    def piece(self, piece):
        if self.first is None:
            self.first = time.perf_counter()

    def finish(self, error):
        self.error = error
        self.ended.set()


def first_tokens(scheduler: Scheduler, jobs: list, gap: float) -> list:
    """Submit `jobs` `gap` seconds apart; each one's seconds from its submission to its first piece."""
    submitted = []
    for job in jobs:
        submitted.append(time.perf_counter())
        scheduler.submit(job)
        time.sleep(gap)
    for job in jobs:
        job.ended.wait()
        if job.error is not None:
            raise job.error
    return [job.first - at for job, at in zip(jobs, submitted)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("package", nargs="?", default=os.path.join("models", "distilgpt2"))
    parser.add_argument("--rounds", type=int, default=4, help="rounds of one request alone, then one burst")
    parser.add_argument("--burst", type=int, default=4, help="requests in a burst")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--gap-ms", type=float, default=2.0, help="between two requests of a burst")
    parser.add_argument("--max-batch", type=int, default=16)
    args = parser.parse_args()

    model = load(args.package)
    scheduler = Scheduler(model, args.max_batch)

    def job(i: int) -> Job:
        return Job(
            model.batch([PROMPTS[i % len(PROMPTS)]], do_sample=False, ignore_eos=True, max_new_tokens=args.max_tokens)
        )

    alone, burst = [], []
    try:
        first_tokens(scheduler, [job(0)], 0)  # warm-up, not counted
        for r in range(args.rounds):
            alone += first_tokens(scheduler, [job(r)], 0)
            burst += first_tokens(scheduler, [job(i) for i in range(args.burst)], args.gap_ms / 1000)
    finally:
        scheduler.close()
    one, many = statistics.median(alone), statistics.median(burst)
    print(
        f"first token: alone p50 {one * 1000:.1f} ms; burst of {args.burst} p50 {many * 1000:.1f} ms "
        f"({many / one:.2f}x), worst {max(burst) * 1000:.1f} ms"
    )


if __name__ == "__main__":
    main()
