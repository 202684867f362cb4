"""The one settings object: environment variables with the QG_ prefix, passed in explicitly."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


def _default_tracking_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path.cwd() / 'mlflow.db'}"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="QG_")

    results_dir: Path = Field(
        default=Path("runs"), description="Where each run's per-stage results folder is written."
    )
    mlflow_tracking_uri: str = Field(
        default_factory=_default_tracking_uri,
        description="MLflow store; defaults to MLFLOW_TRACKING_URI, else sqlite in the cwd.",
    )
    mlflow_experiment: str = Field(default="quantgate", description="MLflow experiment name.")
    reports_dir: Path = Field(default=Path("reports"), description="Where sign-off reports go.")
    signer: str | None = Field(default=None, description="Name put in the report's sign-off block.")
    num_concurrent: int = Field(default=4, ge=1, description="Parallel eval requests (lm-eval).")
    cache_dir: Path | None = Field(
        default=None, description="The stage cache; default: `cache` under the results folder."
    )
    state_dir: Path = Field(
        default=Path(".quantgate"), description="The service's servers, logs and address file."
    )

    @property
    def stage_cache_dir(self) -> Path:
        return (self.cache_dir or self.results_dir / "cache").resolve()
