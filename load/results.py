"""Typed load results: raw per-request samples and the figures computed from them."""

from __future__ import annotations

import math
from typing import ClassVar, Literal

import numpy as np
import pandas as pd
from pydantic import BaseModel, Field

from infra.cores import CorePlan, format_cores
from infra.stored import Stored

# Figures that get a confidence interval across repeats: LoadSummary has `<name>_ci` for each
# (percentile fields keep their unit last: ttft_p50_ms -> ttft_p50_ci_ms).
CI_FIGURES = (
    "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms",
    "tpot_p50_ms", "tpot_p90_ms", "tpot_p99_ms",
    "itl_p50_ms", "e2e_p50_ms",
    "requests_per_s", "output_tokens_per_s", "goodput",
)  # fmt: skip


def ci_field(figure: str) -> str:
    """The LoadSummary field holding the interval of `figure`."""
    return figure[:-3] + "_ci_ms" if figure.endswith("_ms") else figure + "_ci"


class LoadSample(BaseModel):
    """One streamed request as seen by the client."""

    start_s: float = Field(description="Wall-clock start (unix seconds).")
    ttft_ms: float | None = Field(default=None, description="Time to first token.")
    e2e_ms: float | None = Field(default=None, description="Time to last byte of the stream.")
    output_tokens: int = Field(default=0, description="Tokens received (usage or chunk count).")
    itl_ms: list[float] = Field(
        default_factory=list, description="Gaps between consecutive tokens."
    )
    error: str | None = Field(
        default=None, description="Why the request failed; None when it succeeded."
    )
    end_s: float | None = Field(
        default=None, description="Wall-clock end (unix seconds), also for failed requests."
    )
    scheduled_s: float | None = Field(
        default=None, description="Open-loop runs: when the arrival process meant it to start."
    )
    worker: str | None = Field(
        default=None, description="Which Locust process sent it (distributed mode)."
    )
    repeat: int = Field(default=0, description="Which repeat of the level (0-based).")
    prompt_tokens: int | None = Field(
        default=None, description="Prompt tokens sent (token ids: the count is exact).")

    @property
    def tpot_ms(self) -> float | None:
        if self.error or self.ttft_ms is None or self.e2e_ms is None or self.output_tokens < 2:
            return None
        return (self.e2e_ms - self.ttft_ms) / (self.output_tokens - 1)

    @property
    def dispatch_lag_ms(self) -> float | None:
        """How late an open-loop request left against its scheduled arrival."""
        if self.scheduled_s is None:
            return None
        return max(0.0, (self.start_s - self.scheduled_s) * 1000)


class LoadSummary(BaseModel):
    """Figures for one concurrency level, computed from raw samples (never Locust's CSV)."""

    level: str = Field(description="'low' or 'high'.")
    users: int
    requests: int
    errors: int
    error_rate: float
    duration_s: float
    requests_per_s: float
    output_tokens_per_s: float
    ttft_p50_ms: float | None = None
    ttft_p90_ms: float | None = None
    ttft_p99_ms: float | None = None
    tpot_p50_ms: float | None = None
    tpot_p90_ms: float | None = None
    tpot_p99_ms: float | None = None
    itl_p50_ms: float | None = None
    itl_p90_ms: float | None = None
    itl_p99_ms: float | None = None
    e2e_p50_ms: float | None = None
    e2e_p90_ms: float | None = None
    e2e_p99_ms: float | None = None
    # Goodput: share of all requests (failed ones included) that met the profile's SLO.
    goodput: float | None = Field(default=None, description="Share meeting the SLO; None: no SLO.")
    goodput_requests_per_s: float | None = Field(
        default=None, description="Requests per second that met the SLO."
    )
    repeats: int = Field(default=1, description="Runs pooled into this summary.")
    # 95 % Student-t intervals over the per-repeat values; None with a single repeat.
    ttft_p50_ci_ms: tuple[float, float] | None = None
    ttft_p90_ci_ms: tuple[float, float] | None = None
    ttft_p99_ci_ms: tuple[float, float] | None = None
    tpot_p50_ci_ms: tuple[float, float] | None = None
    tpot_p90_ci_ms: tuple[float, float] | None = None
    tpot_p99_ci_ms: tuple[float, float] | None = None
    itl_p50_ci_ms: tuple[float, float] | None = None
    e2e_p50_ci_ms: tuple[float, float] | None = None
    requests_per_s_ci: tuple[float, float] | None = None
    output_tokens_per_s_ci: tuple[float, float] | None = None
    goodput_ci: tuple[float, float] | None = None


class CapacityStep(BaseModel):
    """One tried Poisson arrival rate of the capacity search."""

    rate: float = Field(description="Offered rate (requests/s).")
    achieved_rate: float = Field(description="Requests that started per measured second.")
    requests: int
    errors: int
    goodput: float = Field(description="Share of requests that met the SLO (failures do not).")
    passed: bool
    dispatch_lag_p99_ms: float | None = Field(
        default=None, description="Lateness of arrivals; large means the user pool ran dry."
    )
    ttft_p50_ms: float | None = None
    tpot_p50_ms: float | None = None
    stopped_s: float | None = Field(
        default=None, description="Stopped this many seconds into the window: decided early "
        "(more misses than the target allows), so it failed without running out the window.")


class LoadResult(Stored):
    """Load results of one stage: a summary per level plus the raw samples."""

    FILE: ClassVar[str] = "load.json"

    summaries: dict[str, LoadSummary] = Field(default_factory=dict)
    samples: dict[str, list[LoadSample]] = Field(default_factory=dict)
    max_error_rate: float | None = Field(
        default=None, description="The profile's error-rate limit the run was measured against."
    )
    repeat_summaries: dict[str, list[LoadSummary]] = Field(
        default_factory=dict, description="Per level, one summary per repeat (CIs come from them)."
    )
    capacity_rps: float | None = Field(
        default=None,
        description="Highest tried rate meeting the SLO target; None: not searched or even "
        "min_rate failed (see capacity_note).",
    )
    capacity_note: str | None = Field(default=None, description="How the search ended.")
    capacity_s: float | None = Field(default=None, description="Wall time of the search.")
    capacity_trace: list[CapacityStep] = Field(default_factory=list)
    # Where Locust and the engine ran (infra/cores.py); empty in results stored before it was kept.
    client_cores: str = Field(default="", description="Cores the load generator ran on (0-1).")
    engine_cores: str = Field(
        default="", description="Cores the engine was bound to; empty: not on this CPU or unknown.")
    cores_shared: bool = Field(
        default=False, description="The load generator was not kept off the engine's cores.")
    cores_note: str = Field(default="", description="Why they were split or shared.")

    def record_cores(self, plan: CorePlan) -> None:
        self.client_cores = format_cores(plan.client)
        self.engine_cores = format_cores(plan.engine)
        self.cores_shared = plan.shared
        self.cores_note = plan.reason

    def cores_sentence(self) -> str:
        """Where the load generator ran against the engine, in one plain sentence."""
        if not self.client_cores:
            return "where the load generator ran was not recorded"
        if self.cores_shared:
            return (f"load generator and engine shared cores {self.client_cores} "
                    f"({self.cores_note}): client overhead is inside the latency figures")
        client = f"load generator on {_cores(self.client_cores)}"
        if not self.engine_cores:
            return f"{client} ({self.cores_note})"
        return f"{client}, engine on {_cores(self.engine_cores)} ({self.cores_note}): separate cores"

    def frame(self, level: str) -> pd.DataFrame:
        rows = [s.model_dump() | {"tpot_ms": s.tpot_ms} for s in self.samples.get(level, [])]
        return pd.DataFrame(rows)



def _cores(text: str) -> str:
    return f"core {text}" if text.isdigit() else f"cores {text}"


Side = Literal["reference", "stage"]
Metric = Literal["tpot", "ttft"]


def median_ms(samples: list[LoadSample], metric: Metric) -> float | None:
    """Median TPOT or TTFT of the successful requests; None when none has a positive value."""
    values = [s.tpot_ms if metric == "tpot" else s.ttft_ms for s in samples if s.error is None]
    values = [v for v in values if v is not None and v > 0]
    return float(np.median(values)) if values else None


class PairedRound(BaseModel):
    """One round of one level: the same load against the reference and the stage, back to back."""

    index: int = Field(description="Round number (0-based); both sides got the same prompts.")
    first: Side = Field(description="Which side ran first; alternates by round (A B, B A, A B...).")
    reference: list[LoadSample] = Field(default_factory=list, description="Measured samples.")
    stage: list[LoadSample] = Field(default_factory=list, description="Measured samples.")
    others_cpu_share: float | None = Field(
        default=None, ge=0, le=1, description="Share of the box's CPU that processes outside "
        "this run took during the round (infra.contention); None: not sampled (an engine not "
        "started by this run, or a record from before).")

    def log_ratio(self, metric: Metric) -> float | None:
        """log(median stage / median reference); None when either side has no usable request."""
        mine, theirs = median_ms(self.stage, metric), median_ms(self.reference, metric)
        return math.log(mine / theirs) if mine and theirs else None


class PairedLoad(Stored):
    """A stage timed against its reference in interleaved rounds, both engines up at once.

    Run-to-run drift (the main noise on a shared machine) hits both sides of a round alike, so
    the gates judge the per-round log ratios, not requests pooled across runs.
    """

    FILE: ClassVar[str] = "paired.json"
    reference: str = Field(description="Stage name of the reference: nearest really-served ancestor.")
    reference_command: str | None = Field(
        default=None, description="The reference engine's command line, as it was started."
    )
    requests_per_round: int = Field(description="Measured requests per side, level and round.")
    rounds: dict[str, list[PairedRound]] = Field(
        default_factory=dict, description="Per level, the rounds in the order they ran."
    )

    def others_cpu_share(self, level: str) -> float | None:
        """The most CPU other processes took in any round of the level; None: not sampled."""
        shares = [r.others_cpu_share for r in self.rounds.get(level, [])
                  if r.others_cpu_share is not None]
        return max(shares) if shares else None

    def log_ratios(self, level: str, metric: Metric) -> list[float]:
        """Per usable round: log(median stage / median reference)."""
        ratios = (r.log_ratio(metric) for r in self.rounds.get(level, []))
        return [x for x in ratios if x is not None]

