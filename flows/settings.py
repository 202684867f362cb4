"""The one settings object: environment variables with the QG_ prefix, passed in explicitly."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from urllib.parse import unquote, urlparse

from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from infra.errors import QuantgateError
from infra.secrets import redact


class SettingsError(QuantgateError):
    """A setting (a QG_ or MLflow environment variable) names something quantgate cannot use."""


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
    diagnose_on_rollback: bool = Field(
        default=False, description="On a rollback, measure where each stage that failed a quality "
        "or divergence rule loses (quantgate diagnose: torch on the CPU, minutes for a 135M model, "
        "hours for a 7B one) before the report, which then shows it.")
    repair_on_rollback: bool = Field(
        default=False, description="After that diagnosis (implied), build the cheapest repair it "
        "predicts to pass (LLM Compressor, its own venv) and serve it as a stage of kind repair "
        "in the same run, judged with its own verdict beside the candidate's.")
    diagnose_max_tokens: int = Field(
        default=1024, ge=16, description="Corpus tokens forwarded per group by that diagnosis.")
    signer: str | None = Field(default=None, description="Name put in the report's sign-off block.")
    num_concurrent: int = Field(
        default=64, ge=1, description="Most eval requests in flight (lm-eval's num_concurrent): "
        "the engine batches them (on 2 CPU cores 64 answered 5.8x the items/s of 4); a set of long "
        "prompts sends only what the engine's KV cache holds.")
    cache_dir: Path | None = Field(
        default=None, description="The stage cache; default: `cache` under the results folder."
    )
    state_dir: Path = Field(
        default=Path(".quantgate"), description="The service's servers, logs and address file."
    )

    @property
    def stage_cache_dir(self) -> Path:
        return (self.cache_dir or self.results_dir / "cache").resolve()


def load_settings() -> Settings:
    """The settings from the environment, with a bad variable named instead of a traceback."""
    try:
        return Settings()
    except ValidationError as err:
        problems = "; ".join(f"QG_{'_'.join(map(str, e['loc'])).upper()}: {e['msg']} "
                             f"(got {e.get('input')!r})" for e in err.errors())
        raise SettingsError(f"invalid setting: {problems}") from err


def check_writable(settings: Settings) -> None:
    """Refuse, before anything is measured, folders the run would fail to write an hour in."""
    folders = [("QG_RESULTS_DIR", settings.results_dir), ("QG_REPORTS_DIR", settings.reports_dir),
               ("QG_CACHE_DIR", settings.stage_cache_dir)]
    store = local_tracking_folder(settings.mlflow_tracking_uri)
    if store is not None:
        folders.append(("MLFLOW_TRACKING_URI (or QG_MLFLOW_TRACKING_URI)", store))
    for setting, folder in folders:
        problem = _unwritable(folder)
        if problem:
            shown = redact(settings.mlflow_tracking_uri) if setting.startswith("MLFLOW") else folder
            raise SettingsError(f"{setting}={shown}: cannot write there ({problem}); set "
                                f"{setting.split()[0]} to a writable location")
    from flows.tracking import unreachable

    problem = unreachable(settings.mlflow_tracking_uri)
    if problem:
        raise SettingsError(f"MLFLOW_TRACKING_URI={redact(settings.mlflow_tracking_uri)}: "
                            f"{problem}, or set MLFLOW_TRACKING_URI to another store")


def local_tracking_folder(uri: str) -> Path | None:
    """The folder a local MLflow store writes in (sqlite file's folder, file store), else None."""
    try:
        parsed = urlparse(uri)
    except ValueError:  # a malformed host (http://[::1): no local folder; the probe says why
        return None
    if parsed.scheme == "sqlite":
        # sqlite:///relative.db and sqlite:////absolute.db (SQLAlchemy's spelling)
        path = unquote(uri.removeprefix("sqlite://").split("?", 1)[0])
        path = path[1:] if path.startswith("/") else path
        if path in ("", ":memory:"):
            return None
        return Path(path).parent
    if parsed.scheme == "file":
        return Path(unquote(parsed.path))
    if parsed.scheme == "" or len(parsed.scheme) == 1:  # a plain path (or a Windows drive)
        return Path(uri)
    return None  # a server: its own business


def _unwritable(folder: Path) -> str | None:
    """Why nothing can be written under `folder` (created on demand), or None. Creates nothing:
    the nearest existing folder above it gets a temporary file."""
    existing = folder.absolute()
    while not existing.exists():
        if existing.parent == existing:
            return "no existing folder above it"
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is not a folder"
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as err:
        return f"{existing}: {err.strerror or err}"
    return None
