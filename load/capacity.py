"""Capacity under an SLO: the highest Poisson arrival rate at which enough requests meet it.

A bounded search in the manner of `vllm bench sweep` and GuideLLM: try min_rate (if even that
fails there is no capacity to report), then max_rate (if that passes, capacity is at least
max_rate: the search is censored), then bisect geometrically between the highest passing and
the lowest failing rate. It assumes goodput falls as the rate rises; the trace keeps every step
so a non-monotone result is visible.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from load.profile import Slo
from load.results import CapacityStep, LoadSample, LoadSummary
from load.stats import goodput, meets_slo

# Arrivals that leave this late mean the user pool ran dry: the offered traffic was no longer
# Poisson at the nominal rate, so the step fails rather than claim a rate it did not offer.
MAX_DISPATCH_LAG_MS = 100.0


def capacity_step(
    rate: float, samples: Sequence[LoadSample], window_s: float, slo: Slo, target: float
) -> CapacityStep:
    """Judge one tried rate from the samples that started in its measured window."""
    share = goodput(samples, slo) or 0.0
    lags = [s.dispatch_lag_ms for s in samples if s.dispatch_lag_ms is not None]
    lag_p99 = float(np.percentile(lags, 99)) if lags else None
    ok = [s for s in samples if s.error is None]
    ttfts = [s.ttft_ms for s in ok if s.ttft_ms is not None]
    tpots = [s.tpot_ms for s in ok if s.tpot_ms is not None]
    return CapacityStep(
        rate=rate,
        achieved_rate=len(samples) / window_s,
        requests=len(samples),
        errors=len(samples) - len(ok),
        goodput=share,
        passed=bool(samples) and share >= target and (lag_p99 or 0.0) <= MAX_DISPATCH_LAG_MS,
        dispatch_lag_p99_ms=lag_p99,
        ttft_p50_ms=float(np.median(ttfts)) if ttfts else None,
        tpot_p50_ms=float(np.median(tpots)) if tpots else None,
    )


class MissWatch:
    """Decides a probe early: once more requests in its window have missed the SLO than the
    target allows of all the arrivals the window will see, the rate has failed, whatever the
    remaining requests do; the probe can stop there instead of running out its window. So has
    it once enough requests left late that the dispatch lag's p99 exceeds MAX_DISPATCH_LAG_MS
    even if the window sees a quarter more arrivals than expected."""

    def __init__(self, rate: float, window_s: float, warmup_s: float, slo: Slo, target: float):
        self.warmup_s, self.window_s, self.slo = warmup_s, window_s, slo
        self.allowed = math.floor((1 - target) * rate * window_s)
        most = math.ceil(1.25 * rate * window_s)
        # np.percentile(lags, 99) interpolates at 0.99 (n - 1): it lies above the limit once
        # the sample at that rank does, i.e. once this many samples are late.
        self.late_allowed = most - math.floor(0.99 * (most - 1)) - 1
        self.first_start: float | None = None
        self.seen: list[LoadSample] = []
        self.stopped = False  # set by whoever stopped the probe on its word

    def add(self, samples: Sequence[LoadSample]) -> None:
        self.seen += samples
        starts = [s.start_s for s in samples]
        if starts:
            self.first_start = min([*starts, *([self.first_start] if self.first_start else [])])

    def _in_window(self) -> list[LoadSample]:
        if self.first_start is None:
            return []
        opens = self.first_start + self.warmup_s
        return [s for s in self.seen if opens <= s.start_s < opens + self.window_s]

    def misses(self) -> int:
        return sum(not meets_slo(s, self.slo) for s in self._in_window())

    def late(self) -> int:
        return sum((s.dispatch_lag_ms or 0.0) > MAX_DISPATCH_LAG_MS for s in self._in_window())

    def failed(self) -> bool:
        return self.misses() > self.allowed or self.late() > self.late_allowed


def search_capacity(
    evaluate: Callable[[float], CapacityStep], min_rate: float, max_rate: float, iterations: int,
    min_passes: bool = False, ceiling: float | None = None,
) -> tuple[float | None, str, list[CapacityStep]]:
    """(capacity or None, how the search ended, every step tried) for a rate -> step judge.

    `min_passes`: min_rate is already known to pass (learned from a lighter load), so it is
    not probed again. `ceiling`: max_rate was only a guess; while it passes, the rate doubles
    up to the ceiling before the bisection starts."""
    trace: list[CapacityStep] = []

    def tried(rate: float) -> CapacityStep:
        step = evaluate(rate)
        trace.append(step)
        return step

    if not min_passes and not tried(min_rate).passed:
        return None, f"even min_rate {min_rate:g} req/s misses the SLO target", trace
    low, high = min_rate, max_rate
    while tried(high).passed:
        if ceiling is None or high >= ceiling:
            return high, f"max_rate {high:.3g} req/s still meets the target (censored)", trace
        low, high = high, min(ceiling, 2 * high)
    for _ in range(iterations):
        middle = math.sqrt(low * high)
        if tried(middle).passed:
            low = middle
        else:
            high = middle
    return low, f"between {low:.3g} (passes) and {high:.3g} (fails) req/s", trace


def bracket_from_levels(
    low: LoadSummary, high: LoadSummary, target: float, min_rate: float, max_rate: float
) -> tuple[float, float, str]:
    """The rates to search between, learned from the two closed-loop levels already measured.

    One user at a time is the lightest load the server sees: if it already misses the SLO
    target, no Poisson rate will meet it (the search then tries only the lower end). The high
    level's throughput is what the server sustains at that concurrency: ~1.25x it is the first
    guess at the upper end (a server far from saturation at high_users sustains more, so the
    search doubles a passing upper end up to max_rate); half the low level's rate is
    the lower end (Poisson bursts at twice a single stream's spacing). The profile's min_rate
    and max_rate still bound both, so a search is never wider than the profile allows.
    """
    if not low.requests_per_s or not high.requests_per_s:
        return min_rate, max_rate, "the profile's bounds (the levels measured no throughput)"
    lower = max(min_rate, 0.5 * min(low.requests_per_s, high.requests_per_s))
    upper = min(max_rate, 1.25 * max(low.requests_per_s, high.requests_per_s))
    if lower >= upper:
        lower, upper = min_rate, max_rate
    note = (f"bracket {lower:.3g}-{upper:.3g} req/s from the levels' throughput "
            f"({low.requests_per_s:.3g} at {low.users} user(s), {high.requests_per_s:.3g} at "
            f"{high.users})")
    if low.goodput is not None and low.goodput < target:
        note += f"; one user at a time already meets the SLO for only {low.goodput:.0%}"
    return lower, upper, note
