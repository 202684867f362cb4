"""Gate policy: tolerances per rule, from YAML into pydantic."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from infra.errors import SpecError
from infra.yamlfile import load_model

DEFAULT_POLICY = Path(__file__).with_name("policy.yaml")


class Rules(BaseModel):
    model_config = ConfigDict(extra="forbid")


class QualityRules(Rules):
    max_accuracy_drop: float = Field(0.05, ge=0, le=1, description="Absolute, vs the parent.")
    alpha: float = Field(0.05, gt=0, lt=1, description="One-sided exact McNemar level.")
    min_items: int = Field(20, ge=1, description="Fewer paired items fail closed.")


class PerplexityRules(Rules):
    max_increase_vs_parent: float = Field(0.05, ge=0, description="Relative increase allowed.")
    max_increase_vs_baseline: float = Field(0.10, ge=0, description="Relative increase allowed.")


class LatencyRules(Rules):
    level: str = Field("low", description="Which load level judges latency.")
    max_tpot_p50_increase: float = Field(0.25, ge=0, description="Relative, vs the parent.")
    max_ttft_p50_increase: float = Field(0.50, ge=0, description="Relative, vs the parent.")


class LoadRules(Rules):
    max_error_rate: float = Field(0.01, ge=0, le=1, description="Per level.")


class LengthRules(Rules):
    max_abs_mean_log_ratio: float = Field(0.10, ge=0, description="Paired, vs the parent.")


class GatePolicy(Rules):
    quality: QualityRules = Field(default_factory=QualityRules)
    perplexity: PerplexityRules = Field(default_factory=PerplexityRules)
    latency: LatencyRules = Field(default_factory=LatencyRules)
    load: LoadRules = Field(default_factory=LoadRules)
    length: LengthRules = Field(default_factory=LengthRules)


def load_policy(name_or_path: str, base_dir: Path | None = None) -> GatePolicy:
    """'default' is gates/policy.yaml; anything else is a path (relative to base_dir)."""
    if name_or_path == "default":
        return load_model(DEFAULT_POLICY, GatePolicy)
    path = Path(name_or_path)
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    if not path.is_file():
        raise SpecError(f"gate policy {name_or_path!r} not found (looked at {path}); use 'default'")
    return load_model(path, GatePolicy)
