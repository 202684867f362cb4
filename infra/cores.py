"""Which CPU cores the engine binds and which the load generator gets, so one does not time the other."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Sequence

from pydantic import BaseModel, Field

from infra.errors import SpecError

# Below this many usable cores the engine gets them all and the load generator shares them.
MIN_CORES_TO_SPLIT = 4
# From this many usable cores on, the load generator gets two cores instead of one.
TWO_CLIENT_CORES_FROM = 16
# vLLM's own words for VLLM_CPU_OMP_THREADS_BIND: it picks the cores, or binds none.
BIND_KEYWORDS = ("auto", "nobind")
# Run in the child before Locust: pin itself, then exec the real command (which inherits it).
# Not preexec_fn: that runs Python between fork and exec, unsafe in a threaded parent (Prefect).
_PIN_AND_EXEC = (
    "import os, sys; os.sched_setaffinity(0, [int(c) for c in sys.argv[1].split(',')]); "
    "os.execvp(sys.argv[2], sys.argv[2:])"
)


def usable_cores() -> tuple[int, ...]:
    """The cores this process may run on (taskset, cgroup cpusets), not every core of the box."""
    return tuple(sorted(os.sched_getaffinity(0)))


def format_cores(cores: Iterable[int]) -> str:
    """Core ids as vLLM and taskset write them: 0-3,8,10-11."""
    ids = sorted(set(cores))
    ranges: list[str] = []
    start = previous = None
    for core in ids + [None]:
        if previous is not None and core == previous + 1:
            previous = core
            continue
        if start is not None:
            ranges.append(str(start) if start == previous else f"{start}-{previous}")
        start = previous = core
    return ",".join(ranges)


def parse_bind(bind: str) -> list[tuple[int, ...]]:
    """VLLM_CPU_OMP_THREADS_BIND as core ids per rank: '0-3|4-7' -> [(0, 1, 2, 3), (4, 5, 6, 7)].

    'auto' and 'nobind' are vLLM's keywords, not lists: they give no ranks ([]).
    """
    if bind.strip() in BIND_KEYWORDS:
        return []
    ranks = []
    for rank in bind.split("|"):
        cores: set[int] = set()
        for part in rank.split(","):
            low, dash, high = part.strip().partition("-")
            if not low.isdigit() or (dash and not high.isdigit()):
                raise SpecError(
                    f"engine.omp_threads_bind {bind!r}: {part.strip()!r} is not a core id or a "
                    "range; write ids and ranges like '0-3', '0,2,4' or '0-3|4-7' (one list per "
                    f"rank), or one of {', '.join(BIND_KEYWORDS)}"
                )
            first, last = int(low), int(high) if dash else int(low)
            if last < first:
                raise SpecError(f"engine.omp_threads_bind {bind!r}: range {part.strip()!r} runs "
                                f"backwards; did you mean '{last}-{first}'?")
            cores.update(range(first, last + 1))
        ranks.append(tuple(sorted(cores)))
    return ranks


class CorePlan(BaseModel):
    """Where the engine's threads and the load generator run on this host."""

    usable: tuple[int, ...] = Field(description="Cores this process may use.")
    engine: tuple[int, ...] = Field(
        description="Cores the engine binds; empty: not on this CPU (GPU) or not known.")
    client: tuple[int, ...] = Field(description="Cores the load generator (Locust) runs on.")
    shared: bool = Field(description="True: the load generator was not kept off the engine's cores.")
    reason: str = Field(description="Why the cores were split or shared, with the numbers.")
    engine_bind: str | None = Field(
        default=None, description="VLLM_CPU_OMP_THREADS_BIND for a CPU engine; None: nothing to bind.")

    @property
    def pins_client(self) -> bool:
        """Whether Locust must be pinned: its cores are fewer than it would get anyway."""
        return bool(self.client) and set(self.client) != set(self.usable)

    def pin(self, command: Sequence[str]) -> list[str]:
        """The command, run on the load generator's cores (unchanged when nothing is to pin)."""
        if not self.pins_client:
            return list(command)
        return [sys.executable, "-c", _PIN_AND_EXEC, ",".join(map(str, self.client)), *command]

    @classmethod
    def unplanned(cls, usable: Iterable[int] | None = None) -> CorePlan:
        """No plan given (the engine was not started with one): nothing pinned, nothing claimed."""
        cores = tuple(sorted(usable)) if usable is not None else usable_cores()
        return cls(usable=cores, engine=(), client=cores, shared=True,
                   reason="no core plan: the load generator was not kept off the engine's cores")


def client_core_count(usable: int) -> int:
    """Cores kept for the load generator: none below 4 usable, 1 up to 15, 2 from 16."""
    if usable < MIN_CORES_TO_SPLIT:
        return 0
    return 2 if usable >= TWO_CLIENT_CORES_FROM else 1


def plan_cores(device: str = "cpu", omp_threads_bind: str | None = None,
               usable: Iterable[int] | None = None) -> CorePlan:
    """The engine's and the load generator's cores, from the cores this process may use.

    An explicit `omp_threads_bind` wins for the engine; the load generator then gets the usable
    cores outside it. A GPU engine binds no CPU core: the load generator gets every one.
    """
    cores = tuple(sorted(set(usable))) if usable is not None else usable_cores()
    count = f"{len(cores)} usable core{'s' if len(cores) != 1 else ''}"
    if device != "cpu":
        return CorePlan(usable=cores, engine=(), client=cores, shared=False,
                        reason=f"the engine runs on the {device} device; {count} for the client")
    if omp_threads_bind:
        return _explicit(omp_threads_bind.strip(), cores, count)
    kept = client_core_count(len(cores))
    if not kept:
        return CorePlan(usable=cores, engine=cores, client=cores, shared=True,
                        reason=f"{count}: the engine needs them all",
                        engine_bind=format_cores(cores))
    # The lowest cores for the client (core 0 also takes the OS's housekeeping), a contiguous
    # block above for the engine.
    client, engine = cores[:kept], cores[kept:]
    return CorePlan(usable=cores, engine=engine, client=client, shared=False,
                    reason=f"{count}: {kept} kept for the load generator",
                    engine_bind=format_cores(engine))


def _explicit(bind: str, cores: tuple[int, ...], count: str) -> CorePlan:
    ranks = parse_bind(bind)
    if not ranks:
        what = ("vLLM picks the engine's cores" if bind == "auto"
                else "the engine's threads may run on any core")
        return CorePlan(usable=cores, engine=(), client=cores, shared=True,
                        reason=f"engine.omp_threads_bind {bind!r}: {what}", engine_bind=bind)
    engine = tuple(sorted({core for rank in ranks for core in rank}))
    client = tuple(core for core in cores if core not in engine)
    if not client:
        return CorePlan(usable=cores, engine=engine, client=cores, shared=True,
                        reason=f"engine.omp_threads_bind {bind!r} takes all {count}",
                        engine_bind=bind)
    return CorePlan(usable=cores, engine=engine, client=client, shared=False,
                    reason=f"engine.omp_threads_bind {bind!r}; {count}", engine_bind=bind)


def plan_for(engine_spec, usable: Iterable[int] | None = None) -> CorePlan:
    """The plan for a spec's engine, as its kind makes it (infra/engine.py EngineArgs)."""
    return engine_spec.core_plan(usable)
