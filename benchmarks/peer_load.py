"""What else the machine ran while benchmarks/peers.py measured: the load of each round, and which rounds to trust.

A round runs every system's worker in turn. Around it the driver reads /proc/stat (CPU time every core spent
busy since boot) and its own and its children's rusage (the workers it waited for: their CPU time, all
threads). The difference is what other processes used during the round; over the round's capacity (wall
seconds x cores) it says how contended the round was. Steal (time the hypervisor gave this machine's cores to
someone else) counts as others' use: the workers could not run then either.

    before = snapshot(); ...run the round's workers...; load = load_between(before, snapshot())
    load.contended  # others used more than CONTENDED of the round's CPU capacity
"""

import os
import resource
import time
from dataclasses import dataclass

CONTENDED = 0.10  # others' share of the round's CPU capacity above which a round is flagged
ENOUGH_QUIET_ROUNDS = 3  # fewer uncontended rounds than this: the summary's medians are over every round


@dataclass(frozen=True)
class CpuTimes:
    """/proc/stat's totals over every core, in seconds since boot."""

    busy_s: float  # user + nice + system + irq + softirq (guest time is inside user)
    steal_s: float
    cores: int  # the cpuN lines


def parse_proc_stat(text: str, ticks_per_s: int) -> CpuTimes:
    """/proc/stat's text -> its aggregate line's busy and steal time; ticks_per_s is USER_HZ (SC_CLK_TCK)."""
    lines = text.splitlines()
    fields = lines[0].split()
    if fields[0] != "cpu" or len(fields) < 9:
        raise ValueError(f"not /proc/stat's aggregate cpu line: {lines[0]!r}")
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[1:9])
    cores = sum(1 for line in lines[1:] if line.startswith("cpu") and line[3:4].isdigit())
    return CpuTimes((user + nice + system + irq + softirq) / ticks_per_s, steal / ticks_per_s, cores)


@dataclass(frozen=True)
class Snapshot:
    wall_s: float  # time.monotonic()
    cpu: CpuTimes
    ours_s: float  # the driver's CPU time and its waited-for children's (user + system)
    load_average: float  # the 1-minute load average


def snapshot() -> Snapshot:
    ours = sum(
        usage.ru_utime + usage.ru_stime
        for usage in (resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN))
    )
    with open("/proc/stat") as stat:
        cpu = parse_proc_stat(stat.read(), os.sysconf("SC_CLK_TCK"))
    return Snapshot(time.monotonic(), cpu, ours, os.getloadavg()[0])


@dataclass(frozen=True)
class Load:
    """One round's load: what the workers used and what everything else did, in CPU seconds."""

    wall_s: float
    capacity_s: float  # wall seconds x cores
    ours_s: float
    others_s: float  # busy time not ours, steal included; never below 0 (the two clocks tick differently)
    steal_s: float
    load_average: float  # the 1-minute load average at the round's end

    @property
    def others_share(self) -> float:
        return self.others_s / self.capacity_s if self.capacity_s > 0 else 0.0

    @property
    def contended(self) -> bool:
        return self.others_share > CONTENDED

    def describe(self) -> str:
        flag = " CONTENDED" if self.contended else ""
        return (
            f"load average {self.load_average:.2f}, others' CPU {self.others_s:.1f} s of {self.capacity_s:.1f} s"
            f" ({100 * self.others_share:.0f}%, steal {self.steal_s:.1f} s), the workers' {self.ours_s:.1f} s{flag}"
        )


def load_between(before: Snapshot, after: Snapshot) -> Load:
    wall = after.wall_s - before.wall_s
    ours = after.ours_s - before.ours_s
    steal = after.cpu.steal_s - before.cpu.steal_s
    busy = after.cpu.busy_s - before.cpu.busy_s
    return Load(
        wall_s=wall,
        capacity_s=wall * after.cpu.cores,
        ours_s=ours,
        others_s=max(0.0, busy - ours) + steal,
        steal_s=steal,
        load_average=after.load_average,
    )


def rounds_to_summarize(loads: list[Load], minimum: int = ENOUGH_QUIET_ROUNDS) -> tuple[list[int], str]:
    """The indexes of the rounds the summary's medians are taken over, and a line saying which and why:
    the uncontended rounds when there are at least `minimum` of them, else every round."""
    quiet = [i for i, load in enumerate(loads) if not load.contended]
    contended = len(loads) - len(quiet)
    head = f"{contended} of {len(loads)} rounds contended (others' CPU > {100 * CONTENDED:.0f}% of capacity)"
    if contended == 0:
        return quiet, f"{head}; medians over every round"
    if len(quiet) >= minimum:
        return quiet, f"{head}; medians over the {len(quiet)} uncontended rounds"
    return list(range(len(loads))), f"{head}; fewer than {minimum} uncontended, so medians over every round"
