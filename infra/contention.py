"""CPU that other processes took while a stage was timed: contention the paired rounds cannot
cancel when it hits one side of a round and not the other.

The box's busy time comes from /proc/stat (psutil.cpu_times: user, nice, system, irq, softirq
and steal, so a process at nice 19 and a hypervisor's steal count too); this process tree's from
per-process accounting (psutil: this process, every live descendant — the engines it started,
their worker processes and threads — and the children it already reaped). What is left is the
others' share of the box over the window: 0.25 on 2 cores is half a core taken from the engine
and its clients.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import psutil

BUSY_FIELDS = ("user", "nice", "system", "irq", "softirq", "steal")


@dataclass(frozen=True)
class CpuSample:
    wall_s: float
    busy_s: float  # the whole box, all cores
    ours_s: float  # this process tree
    cores: int


def _tree_seconds() -> float:
    me = psutil.Process()
    total = 0.0
    for process in [me, *me.children(recursive=True)]:
        try:
            times = process.cpu_times()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue  # gone between listing and reading: its time shows in its parent's reaped
        total += times.user + times.system + times.children_user + times.children_system
    return total


def sample() -> CpuSample:
    box = psutil.cpu_times()
    busy = sum(getattr(box, name, 0.0) for name in BUSY_FIELDS)
    return CpuSample(time.monotonic(), busy, _tree_seconds(), psutil.cpu_count() or 1)


def others_share(start: CpuSample, end: CpuSample) -> float | None:
    """The share of the box's CPU (0..1) that processes outside this tree took between two
    samples; None over a window too short to read (the kernel counts in 10 ms ticks)."""
    wall = end.wall_s - start.wall_s
    if wall < 0.5:
        return None
    others = (end.busy_s - start.busy_s) - (end.ours_s - start.ours_s)
    return min(1.0, max(0.0, others / (wall * end.cores)))
