"""Predictions for one stage on one device: low-load latency, p99 at a rate, capacity under an SLO."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from gates.whatif.scheduler import SchedulerConfig, SimResult, simulate
from gates.whatif.steptime import Roofline
from load.capacity import search_capacity
from load.profile import Slo
from load.results import CapacityStep


class Workload(BaseModel):
    """Fixed-size requests and the SLO a share of them must meet (as in the load profile)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    prompt_tokens: int = Field(gt=0)
    output_tokens: int = Field(gt=1)
    slo: Slo = Field(default_factory=lambda: Slo(ttft_ms=1000.0, tpot_ms=40.0))
    target: float = Field(default=0.99, gt=0, le=1, description="Share that must meet the SLO.")


class SimSettings(BaseModel):
    """How long each simulated rate runs: seeded, so every prediction is repeatable."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    warmup_s: float = Field(default=10.0, ge=0, description="Arrivals before this are not measured.")
    max_warmup_requests: int | None = Field(
        default=None, ge=0, description="At most this many warm-up arrivals (a small model's "
        "capacity runs to thousands of req/s, where 10 s of warm-up is most of the cost).")
    measured_requests: int = Field(default=2000, gt=0, description="Requests judged per rate.")
    seed: int = 0
    iterations: int = Field(
        default=10, ge=1, description="Bisection steps: the bracket to within 0.4 %."
    )


@dataclass(frozen=True)
class AtRate:
    """Simulated percentiles at one Poisson rate."""

    rate: float
    ttft_p99_ms: float
    tpot_p99_ms: float
    step: CapacityStep
    result: SimResult


def low_load(roofline: Roofline, config: SchedulerConfig, workload: Workload) -> tuple[float, float]:
    """(TTFT ms, TPOT ms) of a request served alone."""
    result = simulate(
        roofline, config, np.zeros(1), workload.prompt_tokens, workload.output_tokens,
        measured=np.ones(1, dtype=bool),
    )
    return float(result.ttft_ms[0]), float(result.tpot_ms[0])


def at_rate(
    roofline: Roofline,
    config: SchedulerConfig,
    workload: Workload,
    rate: float,
    settings: SimSettings | None = None,
) -> AtRate:
    """Serve Poisson arrivals at `rate` req/s; the same seed draws the same arrivals scaled to it."""
    settings = settings or SimSettings()
    warmup = int(np.ceil(rate * settings.warmup_s))
    if settings.max_warmup_requests is not None:
        warmup = min(warmup, settings.max_warmup_requests)
    count = warmup + settings.measured_requests
    gaps = np.random.default_rng(settings.seed).standard_exponential(count)
    arrivals = np.cumsum(gaps) / rate
    measured = np.zeros(count, dtype=bool)
    measured[warmup:] = True
    slo = workload.slo
    # A measured request still running this late has missed the SLO whatever comes next.
    late_s = ((slo.ttft_ms or 60_000) + (slo.tpot_ms or 1_000) * workload.output_tokens) / 1e3
    result = simulate(
        roofline, config, arrivals, workload.prompt_tokens, workload.output_tokens, measured,
        deadline_s=float(arrivals[-1]) + late_s,
        ttft_limit_s=(slo.ttft_ms or np.inf) / 1e3,
        max_late=int(np.floor((1 - workload.target) * settings.measured_requests)),
    )
    meets = np.ones(len(result.ttft_ms), dtype=bool)
    if slo.ttft_ms is not None:
        meets &= result.ttft_ms <= slo.ttft_ms
    if slo.tpot_ms is not None:
        meets &= result.tpot_ms <= slo.tpot_ms
    unfinished = int(np.sum(~np.isfinite(result.tpot_ms)))
    finite_ttft = result.ttft_ms[np.isfinite(result.ttft_ms)]
    finite_tpot = result.tpot_ms[np.isfinite(result.tpot_ms)]
    goodput = float(meets.mean())
    window = float(arrivals[-1] - arrivals[warmup]) or 1.0
    step = CapacityStep(
        rate=rate,
        achieved_rate=settings.measured_requests / window,
        requests=settings.measured_requests,
        errors=unfinished,
        goodput=goodput,
        passed=goodput >= workload.target,
        ttft_p50_ms=float(np.median(finite_ttft)) if len(finite_ttft) else None,
        tpot_p50_ms=float(np.median(finite_tpot)) if len(finite_tpot) else None,
    )
    return AtRate(
        rate=rate,
        ttft_p99_ms=float(np.percentile(result.ttft_ms, 99, method="higher")),
        tpot_p99_ms=float(np.percentile(result.tpot_ms, 99, method="higher")),
        step=step,
        result=result,
    )


def rate_ceiling(roofline: Roofline, workload: Workload) -> float:
    """A rate no engine can sustain: every token costs at least its body-matmul compute time."""
    tokens = workload.prompt_tokens + workload.output_tokens - 1
    return 1.0 / (tokens * roofline.body_token_s)


def capacity(
    roofline: Roofline,
    config: SchedulerConfig,
    workload: Workload,
    settings: SimSettings | None = None,
) -> tuple[float | None, str, list[CapacityStep]]:
    """Highest Poisson rate meeting the SLO for `target` of requests: (rate, how, steps tried).

    The bracket starts at [ceiling / 40, 2 x ceiling] around `rate_ceiling` (a short run can pass
    at the ceiling itself, where the queue grows slowly); when its low end fails it moves down
    8-fold at a time. The bisection is the load generator's (`load.capacity.search_capacity`),
    run on simulated steps. None when a request served alone already misses the SLO.
    """
    settings = settings or SimSettings()
    slo = workload.slo
    ttft, tpot = low_load(roofline, config, workload)
    if (slo.ttft_ms is not None and ttft > slo.ttft_ms) or (
        slo.tpot_ms is not None and tpot > slo.tpot_ms
    ):
        return None, f"a request served alone misses the SLO (TTFT {ttft:.3g} ms, TPOT {tpot:.3g} ms)", []

    seen: dict[float, CapacityStep] = {}

    def judged(rate: float) -> CapacityStep:
        if rate not in seen:
            seen[rate] = at_rate(roofline, config, workload, rate, settings).step
        return seen[rate]

    ceiling = rate_ceiling(roofline, workload)
    high, low, tried = 2 * ceiling, ceiling / 40, []
    while not (step := judged(low)).passed and low > ceiling * 1e-5:
        tried.append(step)
        high, low = low, low / 8
    rate, how, trace = search_capacity(
        judged, min_rate=low, max_rate=high, iterations=settings.iterations
    )
    return rate, how, tried + trace
