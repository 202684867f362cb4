"""Run the locustfile per concurrency level (and repeat, and rate) and turn raw samples into a LoadResult."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from infra.cores import CorePlan
from infra.errors import MeasurementError
from infra.process import log_tail
from infra.progress import progress
from load.capacity import (
    MAX_DISPATCH_LAG_MS,
    MissWatch,
    bracket_from_levels,
    capacity_step,
    search_capacity,
)
from load.launch import LOCUSTFILE, TAIL_LINES, locust_env, run_locust
from load.profile import LoadProfile
from load.results import CapacityStep, LoadResult, LoadSample, LoadSummary
from load.stats import (
    busy_span_s,
    check_equal_work,
    measured_count,
    measured_window,
    pool_repeats,
    summarize,
)

__all__ = [
    "LOCUSTFILE", "check_equal_work", "measured_window", "read_samples", "run_level",
    "run_load", "run_rate", "summarize",
]  # fmt: skip

# Locust runs a little longer than warm-up + measured window, so the window's last moments
# still see requests start; those started after it are dropped like the warm-up ones.
RUN_MARGIN_S = 2
WARMUP = "warmup"  # the level tag of a run that only warms an engine up


def run_load(
    base_url: str, model: str, profile: LoadProfile, out_dir: Path, cores: CorePlan | None = None,
    request_body: dict | None = None,
) -> LoadResult:
    """Load the server at each level (and repeat) of the profile, then search capacity if enabled.

    `request_body`: fields every request adds (a structured_output stage's response_format).

    Locust runs on the client cores of `cores` (the engine's plan, infra/cores.py); the result
    records them. Raw samples, Locust's HTML reports and load.json land in out_dir.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    cores = cores or CorePlan.unplanned()
    result = LoadResult(max_error_rate=profile.max_error_rate)
    result.record_cores(cores)
    for level, users in profile.levels().items():
        per_repeat: list[list[LoadSample]] = []
        windows: list[float] = []
        for repeat in range(profile.repeats):
            samples = run_level(base_url, model, profile, level, users, out_dir, repeat=repeat,
                                cores=cores, request_body=request_body)
            measured, window_s = measured_part(samples, profile, level)
            check_equal_work(measured, profile.output_tokens, level)
            per_repeat.append(measured)
            windows.append(window_s)
        pooled, each = pool_repeats(per_repeat, windows, level, users, profile.slo)
        result.samples[level] = [s for samples in per_repeat for s in samples]
        result.summaries[level] = pooled
        if profile.repeats > 1:
            result.repeat_summaries[level] = each
    if profile.capacity.enabled:
        started = time.monotonic()
        capacity, note, trace = find_capacity(base_url, model, profile, out_dir, cores,
                                              levels=result.summaries, request_body=request_body)
        result.capacity_rps, result.capacity_note, result.capacity_trace = capacity, note, trace
        result.capacity_s = round(time.monotonic() - started, 2)
    result.save(out_dir)
    return result


def measured_part(
    samples: list[LoadSample], profile: LoadProfile, level: str
) -> tuple[list[LoadSample], float]:
    """The samples that count and the seconds they span; fails closed when none count."""
    if profile.requests is not None:
        measured = measured_count(samples, profile.warmup_requests)
        window_s = busy_span_s(measured)
        if not measured or window_s <= 0:
            raise MeasurementError(
                f"{level}: {len(samples)} requests finished, none left after "
                f"{profile.warmup_requests} warm-up requests"
            )
        return measured, window_s
    measured = measured_window(samples, profile.warmup_s, profile.duration_s)
    if not measured:
        # Fail closed: an empty window would otherwise read as "no errors, no latency".
        raise MeasurementError(
            f"{level}: none of {len(samples)} requests started inside the measured window "
            f"({profile.warmup_s}s warm-up, then {profile.duration_s}s); requests take "
            f"longer than the window: raise duration_s or shrink output_tokens"
        )
    return measured, profile.duration_s


def level_tag(level: str, repeat: int) -> str:
    """File-name tag of one run: 'high' for the first repeat, 'high-r2' for the second..."""
    return level if repeat == 0 else f"{level}-r{repeat + 1}"


def run_level(
    base_url: str,
    model: str,
    profile: LoadProfile,
    level: str,
    users: int,
    out_dir: Path,
    *,
    repeat: int = 0,
    cores: CorePlan | None = None,
    request_body: dict | None = None,
    salt: str = "",
) -> list[LoadSample]:
    """One closed-loop Locust run (local or distributed); every raw sample, warm-up included."""
    tag = level_tag(level, repeat)
    samples_path = out_dir / f"samples_{tag}.jsonl"
    out_dir.mkdir(parents=True, exist_ok=True)
    samples_path.unlink(missing_ok=True)
    stop_timeout_s = math.ceil(profile.request_timeout_s)
    if profile.requests is not None:
        budget = profile.warmup_requests + profile.requests
        # The run quits itself once the budget is spent; this is only a safety limit.
        run_s = math.ceil(profile.request_timeout_s * math.ceil(budget / users)) + RUN_MARGIN_S
    else:
        budget = 0
        run_s = math.ceil(profile.warmup_s + profile.duration_s) + RUN_MARGIN_S
    env = locust_env(model, profile, tag, samples_path, users, max_requests=budget,
                     request_body=request_body, salt=salt)
    label = f"{who(out_dir)}: load {tag}, {users} user(s)"
    progress.line(f"{label}: {budget} requests" if budget else
                  f"{label}: {run_s - RUN_MARGIN_S} s")
    started = time.monotonic()
    log_path = run_locust(
        base_url, env, users, run_s, stop_timeout_s, out_dir, tag, workers=profile.workers,
        cores=cores, html=repeat == 0 and level != WARMUP,
    )
    samples = [s.model_copy(update={"repeat": repeat}) for s in read_samples(samples_path)]
    if not samples:
        raise MeasurementError(
            f"locust ({tag}, {users} users) recorded no requests; log {log_path}:\n"
            f"{log_tail(log_path, TAIL_LINES)}"
        )
    progress.line(f"{label}: {len(samples)} requests in {time.monotonic() - started:.0f} s, "
                  f"{latency_note(samples)}")
    return samples


def who(out_dir: Path) -> str:
    """The stage a load folder belongs to, for progress lines: <stage>/load, or
    <stage>/load/stage and <stage>/load/reference in interleaved rounds."""
    if out_dir.name in ("stage", "reference") and out_dir.parent.name == "load":
        return f"{out_dir.parent.parent.name} ({out_dir.name})"
    return out_dir.parent.name


def latency_note(samples: list[LoadSample]) -> str:
    """'TTFT p50 112 ms, TPOT p50 29 ms, 0 errors' for a progress line."""
    ttfts = [s.ttft_ms for s in samples if s.error is None and s.ttft_ms is not None]
    tpots = [s.tpot_ms for s in samples if s.error is None and s.tpot_ms is not None]
    parts = [f"{name} p50 {statistics.median(values):.0f} ms"
             for name, values in (("TTFT", ttfts), ("TPOT", tpots)) if values]
    errors = sum(s.error is not None for s in samples)
    return ", ".join([*parts, f"{errors} error(s)"])


def run_rate(
    base_url: str, model: str, profile: LoadProfile, rate: float, out_dir: Path,
    cores: CorePlan | None = None, watch: MissWatch | None = None,
    request_body: dict | None = None,
) -> list[LoadSample]:
    """One open-loop run: Poisson arrivals at `rate` req/s from capacity.pool_users users.

    With a `watch`, the run stops as soon as the watch has seen the rate fail."""
    search = profile.capacity
    tag = f"rate-{rate:.4g}"
    samples_path = out_dir / f"samples_{tag}.jsonl"
    out_dir.mkdir(parents=True, exist_ok=True)
    samples_path.unlink(missing_ok=True)
    users = search.pool_users
    run_s = math.ceil(search.warmup_s + search.window_s(rate)) + RUN_MARGIN_S
    env = locust_env(model, profile, tag, samples_path, users, rate=rate,
                     arrivals_s=search.warmup_s + search.window_s(rate), request_body=request_body)
    stop_timeout_s = math.ceil(profile.request_timeout_s)
    stop_when = _tailing(samples_path, watch) if watch is not None else None
    run_locust(base_url, env, users, run_s, stop_timeout_s, out_dir, tag, workers=profile.workers,
               cores=cores, stop_when=stop_when, html=False)
    return read_samples(samples_path)


def _tailing(path: Path, watch: MissWatch) -> Callable[[], bool]:
    """Feeds the watch each complete line the locustfile appended since the last call."""
    offset = 0

    def failed() -> bool:
        nonlocal offset
        if not path.exists():
            return False
        with path.open("rb") as stream:
            stream.seek(offset)
            chunk = stream.read()
        complete = chunk[: chunk.rfind(b"\n") + 1]
        offset += len(complete)
        watch.add([LoadSample.model_validate_json(line) for line in complete.splitlines()
                   if line.strip()])
        watch.stopped = watch.failed()
        return watch.stopped

    return failed


def find_capacity(
    base_url: str, model: str, profile: LoadProfile, out_dir: Path, cores: CorePlan | None = None,
    levels: dict[str, LoadSummary] | None = None, request_body: dict | None = None,
) -> tuple[float | None, str, list[CapacityStep]]:
    """Bounded search for the highest rate at which capacity.target of requests meet the SLO;
    with the closed-loop `levels` measured, between the rates they bound (bracket_from_levels)."""
    search = profile.capacity
    if profile.slo is None:  # the profile validator refuses this; kept for direct callers
        raise MeasurementError("a capacity search needs an SLO in the profile")

    label = f"{who(out_dir)}: capacity"

    def evaluate(rate: float) -> CapacityStep:
        window_s = search.window_s(rate)
        progress.line(f"{label}: probing {rate:.3g} req/s for {search.warmup_s + window_s:.0f} s")
        watch = MissWatch(rate, window_s, search.warmup_s, profile.slo, search.target)
        samples = run_rate(base_url, model, profile, rate, out_dir, cores, watch=watch,
                           request_body=request_body)
        # Judged on every request that arrived in the window, failed and late ones included.
        measured = measured_window(samples, search.warmup_s, window_s)
        if watch.stopped:  # decided early: the requests still queued never finished
            ran_s = max(s.start_s for s in samples) - min(s.start_s for s in samples)
            stopped_s = max(ran_s - search.warmup_s, 1e-3)
            step = capacity_step(rate, measured, stopped_s, profile.slo, search.target)
            step = step.model_copy(update={"passed": False, "stopped_s": round(stopped_s, 2)})
        else:
            step = capacity_step(rate, measured, window_s, profile.slo, search.target)
        stopped = f", stopped after {step.stopped_s:.0f} s" if step.stopped_s is not None else ""
        late = step.dispatch_lag_p99_ms or 0.0
        # Every request in time but arrivals sent late: the client could not offer the rate.
        lag = (f"; arrivals left late, dispatch lag p99 {late:.0f} ms > {MAX_DISPATCH_LAG_MS:g} ms"
               if late > MAX_DISPATCH_LAG_MS else "")
        progress.line(f"{label}: {rate:.3g} req/s {'meets' if step.passed else 'misses'} the SLO "
                      f"({step.goodput:.0%} of {step.requests} requests in time{stopped}{lag})")
        return step

    low, high = (levels or {}).get("low"), (levels or {}).get("high")
    if low is None or high is None:
        return search_capacity(evaluate, search.min_rate, search.max_rate, search.iterations)
    lower, upper, bracket = bracket_from_levels(low, high, search.target, search.min_rate,
                                                search.max_rate)
    # Half one user's rate, where both closed-loop levels (up to high_users at once) met the
    # SLO target, is learned to pass: Poisson arrivals that slow rarely stack that deep.
    learned = (lower < 0.5 * low.requests_per_s * 1.0001
               and all(level.goodput is not None and level.goodput >= search.target
                       for level in (low, high)))
    capacity, note, trace = search_capacity(evaluate, lower, upper, search.iterations,
                                            min_passes=learned, ceiling=search.max_rate)
    if learned:
        bracket += (f"; {lower:.3g} req/s not probed: both levels met the SLO for "
                    f"{min(low.goodput, high.goodput):.0%} of requests")
    return capacity, f"{note}; {bracket}", trace


def read_samples(path: Path) -> list[LoadSample]:
    """The JSON lines the locustfile wrote; a missing file is no samples."""
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    return [LoadSample.model_validate_json(line) for line in lines if line.strip()]
