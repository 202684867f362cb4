"""Typed load results: raw per-request samples and the figures computed from them."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from pydantic import BaseModel, Field


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

    @property
    def tpot_ms(self) -> float | None:
        if self.error or self.ttft_ms is None or self.e2e_ms is None or self.output_tokens < 2:
            return None
        return (self.e2e_ms - self.ttft_ms) / (self.output_tokens - 1)


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


class LoadResult(BaseModel):
    """Load results of one stage: a summary per level plus the raw samples."""

    summaries: dict[str, LoadSummary] = Field(default_factory=dict)
    samples: dict[str, list[LoadSample]] = Field(default_factory=dict)

    def frame(self, level: str) -> pd.DataFrame:
        rows = [s.model_dump() | {"tpot_ms": s.tpot_ms} for s in self.samples.get(level, [])]
        return pd.DataFrame(rows)

    def save(self, folder: Path) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / "load.json"
        path.write_text(self.model_dump_json(indent=1))
        return path

    @classmethod
    def read(cls, folder: Path) -> LoadResult:
        return cls.model_validate_json((folder / "load.json").read_text())
