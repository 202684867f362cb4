"""Typed quality results: one row per eval item, paired across stages by item id."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
from pydantic import BaseModel, Field


class QualityItem(BaseModel):
    """One eval item as answered by one stage."""

    id: str = Field(description="The item's own id from the eval data (doc['id']), stable across stages.")
    prompt_hash: str = Field(description="sha256 of the prompt text (first 16 hex digits).")
    response: str
    score: float = Field(description="The task's primary metric for this item (1.0 = correct).")
    output_tokens: int | None = Field(default=None, description="Tokens in the response.")
    finish_reason: str | None = Field(default=None, description="'stop' or 'length' when known.")
    group: str | None = Field(
        default=None, description="Sub-group for per-group curves, e.g. a long-context length bucket."
    )


class TaskQuality(BaseModel):
    """Results of one eval task on one stage."""

    task: str = Field(description="Eval set name, e.g. 'math'.")
    metric: str = Field(description="Name of the primary metric, e.g. 'accuracy'.")
    value: float = Field(description="Mean of item scores.")
    items: list[QualityItem]

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame([item.model_dump() for item in self.items])


class Divergence(BaseModel):
    """How far a stage's next-token distribution moved from the baseline's, on the same tokens."""

    tokens: int = Field(description="Token positions compared.")
    mean_kl: float = Field(description="Mean per-token KL(baseline || stage), nats.")
    kl_ci_low: float | None = Field(default=None, description="95 % CI of mean_kl, low end.")
    kl_ci_high: float | None = Field(default=None, description="95 % CI of mean_kl, high end.")
    top1_agreement: float = Field(description="Share of positions with the same most likely token.")


class PerplexityRatio(BaseModel):
    """Stage perplexity / reference perplexity on the same corpus tokens, paired per token."""

    tokens: int = Field(description="Token positions compared.")
    ratio: float = Field(description="exp(mean per-token NLL difference): 1.05 = +5 %.")
    ci_low: float | None = Field(default=None, description="95 % CI of ratio (block bootstrap).")
    ci_high: float | None = Field(default=None, description="95 % CI of ratio, high end.")


class QualityResult(BaseModel):
    """All quality results of one stage."""

    tasks: dict[str, TaskQuality] = Field(default_factory=dict)
    perplexity: float | None = Field(default=None, description="Token perplexity on the local corpus.")
    divergence: Divergence | None = Field(
        default=None, description="Against the baseline; None for the baseline itself."
    )
    perplexity_vs_parent: PerplexityRatio | None = Field(
        default=None, description="Paired against the parent stage; None for the baseline."
    )
    perplexity_vs_baseline: PerplexityRatio | None = Field(
        default=None, description="Paired against the baseline; None for the baseline itself."
    )

    def save(self, folder: Path) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / "quality.json"
        path.write_text(self.model_dump_json(indent=1))
        for name, task in self.tasks.items():
            with (folder / f"samples_{name}.jsonl").open("w") as out:
                for item in task.items:
                    out.write(json.dumps(item.model_dump()) + "\n")
        return path

    @classmethod
    def read(cls, folder: Path) -> QualityResult:
        return cls.model_validate_json((folder / "quality.json").read_text())
