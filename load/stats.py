"""Pure statistics over raw samples: windows, percentiles, goodput and intervals across repeats."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import stats

from infra.errors import MeasurementError
from load.profile import Slo
from load.results import CI_FIGURES, LoadSample, LoadSummary, ci_field

PERCENTILES = (50, 90, 99)
CONFIDENCE = 0.95


def measured_window(samples: Sequence[LoadSample], warmup_s: float, duration_s: float) -> list[LoadSample]:
    """Samples that started inside the measured window, which opens warmup_s after the first."""
    if not samples:
        return []
    opens = min(s.start_s for s in samples) + warmup_s
    closes = opens + duration_s
    return [s for s in samples if opens <= s.start_s < closes]


def measured_count(samples: Sequence[LoadSample], warmup_requests: int) -> list[LoadSample]:
    """Request-count runs: every sample but the first `warmup_requests` to start."""
    return sorted(samples, key=lambda s: s.start_s)[warmup_requests:]


def busy_span_s(samples: Sequence[LoadSample]) -> float:
    """Seconds from the first start to the last end: the window of a request-count run.

    Like `vllm bench serve`, throughput over this span includes the drain at the end.
    """
    if not samples:
        return 0.0
    ends = [_end_s(s) for s in samples]
    return max(ends) - min(s.start_s for s in samples)


def _end_s(sample: LoadSample) -> float:
    if sample.end_s is not None:
        return sample.end_s
    return sample.start_s + (sample.e2e_ms or sample.ttft_ms or 0.0) / 1000


def check_equal_work(samples: Sequence[LoadSample], output_tokens: int, level: str) -> None:
    """Every stage must do the same work; an engine that stops early makes timings incomparable."""
    short = [s.output_tokens for s in samples if s.error is None and s.output_tokens != output_tokens]
    if short:
        raise MeasurementError(
            f"{level}: {len(short)} requests returned {sorted(set(short))} output tokens instead "
            f"of {output_tokens}; does the engine honour ignore_eos and max_tokens?"
        )


def meets_slo(sample: LoadSample, slo: Slo) -> bool:
    """A request meets the SLO when it succeeded and every bound the SLO sets holds."""
    if sample.error is not None or sample.ttft_ms is None:
        return False
    if slo.ttft_ms is not None and sample.ttft_ms > slo.ttft_ms:
        return False
    if slo.tpot_ms is not None:
        tpot = sample.tpot_ms
        if tpot is None or tpot > slo.tpot_ms:
            return False
    return True


def goodput(samples: Sequence[LoadSample], slo: Slo) -> float | None:
    """Share of requests (failed ones included) that met the SLO; None without requests."""
    if not samples:
        return None
    return sum(meets_slo(s, slo) for s in samples) / len(samples)


def summarize(
    samples: Sequence[LoadSample], level: str, users: int, window_s: float, slo: Slo | None = None
) -> LoadSummary:
    """Percentiles and rates of one level's measured samples (pure; window_s > 0)."""
    if window_s <= 0:
        raise ValueError(f"window_s must be > 0, got {window_s}")
    ok = [s for s in samples if s.error is None]
    errors = len(samples) - len(ok)
    figures: dict[str, float | None] = {}
    series = {
        "ttft": [s.ttft_ms for s in ok if s.ttft_ms is not None],
        "tpot": [s.tpot_ms for s in ok if s.tpot_ms is not None],
        "itl": [gap for s in ok for gap in s.itl_ms],
        "e2e": [s.e2e_ms for s in ok if s.e2e_ms is not None],
    }
    for name, values in series.items():
        points = np.percentile(values, PERCENTILES) if values else [None] * len(PERCENTILES)
        for pct, value in zip(PERCENTILES, points, strict=True):
            figures[f"{name}_p{pct}_ms"] = None if value is None else float(value)
    good = goodput(samples, slo) if slo is not None else None
    return LoadSummary(
        level=level,
        users=users,
        requests=len(samples),
        errors=errors,
        error_rate=errors / len(samples) if samples else 0.0,
        duration_s=window_s,
        requests_per_s=len(ok) / window_s,
        output_tokens_per_s=sum(s.output_tokens for s in ok) / window_s,
        goodput=good,
        goodput_requests_per_s=None if good is None else good * len(samples) / window_s,
        **figures,
    )


def t_interval(values: Sequence[float | None], confidence: float = CONFIDENCE) -> tuple[float, float] | None:
    """Student-t interval of the mean of per-repeat values; None for fewer than two."""
    points = [v for v in values if v is not None and math.isfinite(v)]
    if len(points) < 2:
        return None
    mean = float(np.mean(points))
    if np.ptp(points) == 0:
        return (mean, mean)
    half = float(stats.sem(points) * stats.t.ppf((1 + confidence) / 2, len(points) - 1))
    return (mean - half, mean + half)


def pool_repeats(
    per_repeat: Sequence[Sequence[LoadSample]],
    windows_s: Sequence[float],
    level: str,
    users: int,
    slo: Slo | None = None,
) -> tuple[LoadSummary, list[LoadSummary]]:
    """One summary over all repeats' samples, with intervals from the per-repeat summaries."""
    if len(per_repeat) != len(windows_s) or not per_repeat:
        raise ValueError("one window per repeat, at least one repeat")
    summaries = [
        summarize(samples, level, users, window, slo)
        for samples, window in zip(per_repeat, windows_s, strict=True)
    ]
    pooled = summarize(
        [s for samples in per_repeat for s in samples], level, users, float(sum(windows_s)), slo
    )
    intervals = {
        ci_field(figure): t_interval([getattr(summary, figure) for summary in summaries])
        for figure in CI_FIGURES
    }
    return pooled.model_copy(update={"repeats": len(per_repeat), **intervals}), summaries
