"""Where a stage's wall time went, and the clock its phases add to."""

from __future__ import annotations

import contextlib
import datetime
import time
from collections.abc import Iterator

from gates.record import SetTiming, StageRecord, StageTimings


@contextlib.contextmanager
def timed(clock: dict[str, float], phase: str) -> Iterator[None]:
    started = time.monotonic()
    try:
        yield
    finally:
        clock[phase] = clock.get(phase, 0.0) + time.monotonic() - started


def stage_timings(record: StageRecord, clock: dict[str, float], wall_s: float) -> StageTimings:
    """Where the stage's wall time went, from what its results and `clock` hold."""
    own = record.facts.startup_s if record.facts else None
    beside = clock.get("reference_startup")  # the reference engine raced in the load rounds
    timings = StageTimings(wall_s=round(wall_s, 2),
                           startup_s=None if own is None else round(own + (beside or 0.0), 2),
                           more_items_s=_rounded(clock.get("more_items")),
                           load_s=_rounded(clock.get("load")))
    if record.quality is not None:
        timings.scoring_s = record.quality.scoring_s
        for name, task in record.quality.tasks.items():
            timings.sets[name] = SetTiming(
                items=len(task.items), seconds=task.seconds,
                output_tokens=sum(item.output_tokens or 0 for item in task.items))
    if record.load is not None:
        timings.load_levels_s = {level: summary.duration_s
                                 for level, summary in record.load.summaries.items()}
        timings.capacity_s = record.load.capacity_s
    return timings


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def utc_now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
