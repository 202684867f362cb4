"""MLflow logging: a parent run per candidate, a nested run per stage, stable metric names."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from gates.record import StageRecord
from gates.verdict import Verdict
from infra.errors import QuantgateError
from infra.secrets import redact

if TYPE_CHECKING:
    from mlflow import MlflowClient

LOAD_FIGURES = (
    "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p90_ms", "tpot_p99_ms",
    "itl_p50_ms", "itl_p90_ms", "itl_p99_ms", "e2e_p50_ms", "e2e_p90_ms", "e2e_p99_ms",
    "requests_per_s", "output_tokens_per_s", "error_rate", "goodput", "goodput_requests_per_s",
)


def stage_params(record: StageRecord) -> dict[str, str]:
    params = {f"axis.{axis}": value for axis, value in record.axes.items()}
    params |= {"stage_kind": record.kind, "parent": str(record.parent), "changed": ",".join(
        record.changed) or "-"}
    if record.facts:
        params |= {
            "engine.command": record.facts.command_line()[:6000],
            "engine.version": str(record.facts.version),
            "engine.kv_cache_dtype": str(record.facts.kv_cache_dtype),
        }
    return params


def timing_metrics(record: StageRecord) -> dict[str, float]:
    """time.*: where the stage's wall time went (seconds), engine-busy and overhead shares."""
    timings = record.timings
    if timings is None:
        return {}
    metrics = {"time.wall_s": timings.wall_s, "time.busy_s": round(timings.busy_s, 2),
               "time.overhead_s": round(timings.overhead_s, 2)}
    if timings.wall_s > 0:
        metrics["time.busy_share"] = round(timings.busy_s / timings.wall_s, 4)
    for name in ("startup_s", "scoring_s", "more_items_s", "load_s", "capacity_s"):
        if getattr(timings, name) is not None:
            metrics[f"time.{name}"] = float(getattr(timings, name))
    for name, timing in timings.sets.items():
        if timing.seconds is not None:
            metrics[f"time.quality.{name}_s"] = timing.seconds
    for level, seconds in timings.load_levels_s.items():
        metrics[f"time.load.{level}_s"] = seconds
    return metrics


def stage_metrics(record: StageRecord) -> dict[str, float]:
    metrics: dict[str, float] = timing_metrics(record)
    facts = record.facts
    if facts:
        for name in ("kv_cache_tokens", "weight_bytes", "startup_s", "max_model_len"):
            value = getattr(facts, name)
            if value is not None:
                metrics[f"engine.{name}"] = float(value)
    if record.quality:
        if record.quality.divergence:
            metrics["quality.divergence.mean_kl"] = record.quality.divergence.mean_kl
            metrics["quality.divergence.top1_agreement"] = record.quality.divergence.top1_agreement
        for name, task in record.quality.tasks.items():
            metrics[f"quality.{name}.{task.metric}"] = task.value
            lengths = [i.output_tokens for i in task.items if i.output_tokens is not None]
            if lengths:
                metrics[f"length.{name}.mean_output_tokens"] = sum(lengths) / len(lengths)
        if record.quality.perplexity is not None:
            metrics["quality.perplexity"] = record.quality.perplexity
        for against in ("parent", "baseline"):
            paired = getattr(record.quality, f"perplexity_vs_{against}")
            if paired is not None:
                metrics[f"quality.perplexity_ratio.{against}"] = paired.ratio
    if record.load:
        if record.load.capacity_rps is not None:
            metrics["load.capacity_rps"] = record.load.capacity_rps
        for level, summary in record.load.summaries.items():
            for name in LOAD_FIGURES:
                value = getattr(summary, name)
                if value is not None:
                    metrics[f"load.{level}.{name}"] = float(value)
    return metrics


class StoreError(QuantgateError):
    """An MLflow store that is not there, or that MLflow cannot open."""


VARIABLE = "MLFLOW_TRACKING_URI"
SETTING = f"{VARIABLE} (or QG_MLFLOW_TRACKING_URI)"


def check_store(uri: str, create: bool = False) -> None:
    """Refuse, writing nothing, a store that is not there: MLflow creates a missing sqlite file
    and its tables just by opening it, and retries a server that does not answer for minutes.
    `create`: a missing sqlite file is made (by a command that writes), in a folder that exists."""
    shown = f"{VARIABLE}={redact(uri)}"
    scheme = urlparse(uri).scheme
    if scheme == "sqlite":
        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import ArgumentError

        try:
            database = make_url(uri).database
        except ArgumentError as err:
            raise StoreError(f"{shown}: not a sqlite URI ({err}); set {SETTING} to "
                             "sqlite:///<path to mlflow.db>") from err
        if not database or database == ":memory:" or Path(database).is_file():
            return
        if not create:
            raise StoreError(f"{shown}: no MLflow store there ({Path(database).resolve()} does "
                             f"not exist): nothing to read or change; set {SETTING} to the store "
                             "that holds it, or start `quantgate serve`")
        if not Path(database).resolve().parent.is_dir():
            raise StoreError(f"{shown}: no folder {Path(database).resolve().parent} for the "
                             f"store; create it or set {SETTING} to another store")
    elif scheme in ("http", "https"):
        import httpx

        try:
            httpx.get(f"{uri.rstrip('/')}/health", timeout=5).raise_for_status()
        except httpx.HTTPError as err:
            raise StoreError(f"{shown}: the MLflow server does not answer "
                             f"({type(err).__name__}); start it or set {SETTING} to another "
                             "store") from err


def mlflow_message(err: Exception) -> str:
    """An MlflowException's message on one line (MLflow's span several, with links)."""
    return " ".join(str(getattr(err, "message", err)).split()).rstrip(".")


def open_client(uri: str, create: bool = False) -> MlflowClient:
    """An MlflowClient on a store that is there (`create`: or a new sqlite file), or StoreError
    in one line; opening a sqlite store is what creates it, so the check comes first."""
    check_store(uri, create)
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    try:
        return MlflowClient(uri)
    except MlflowException as err:  # a file store, an unknown scheme: MLflow refuses it
        raise StoreError(f"{VARIABLE}={redact(uri)}: MLflow cannot open it "
                         f"({redact(mlflow_message(err))}); set {SETTING} to a database "
                         "(sqlite:///mlflow.db) or an MLflow server") from err


def redacted(params: dict[str, str]) -> dict[str, str]:
    return {name: redact(str(value)) for name, value in params.items()}


class Tracker:
    """Owns the MLflow runs of one acceptance; marks them FAILED if the flow breaks."""

    def __init__(self, tracking_uri: str, experiment: str) -> None:
        import mlflow

        self.mlflow = mlflow
        mlflow.set_tracking_uri(tracking_uri)
        mlflow.set_experiment(experiment)
        self.parent_run_id: str | None = None

    @contextlib.contextmanager
    def candidate_run(self, candidate: str, params: dict[str, str],
                      tags: dict[str, str] | None = None) -> Iterator[str]:
        with self._run(run_name=candidate, tags={"candidate": candidate} | (tags or {})) as run_id:
            self.parent_run_id = run_id
            self.mlflow.log_params(redacted(params))
            yield run_id

    @contextlib.contextmanager
    def stage_run(self, candidate: str, stage: str, kind: str) -> Iterator[str]:
        """A stage's nested run, open while the stage is measured: its duration and status are
        the stage's own (FAILED when the measuring breaks)."""
        tags = {"candidate": candidate, "stage": stage, "stage_kind": kind}
        with self._run(run_name=f"{candidate}/{stage}", nested=True, tags=tags) as run_id:
            yield run_id

    @contextlib.contextmanager
    def _run(self, **start: object) -> Iterator[str]:
        """An MLflow run, FINISHED when the block ends, FAILED (with why) when it raises."""
        run = self.mlflow.start_run(**start)
        try:
            yield run.info.run_id
        except BaseException as err:
            self.mlflow.set_tag("failure", redact(f"{type(err).__name__}: {err}")[:5000])
            self.mlflow.end_run(status="FAILED")
            raise
        self.mlflow.end_run(status="FINISHED")

    def log_stage(self, record: StageRecord, folder: Path, cached: bool = False) -> None:
        """Into the open stage run: params, metrics, the results folder."""
        self.mlflow.set_tag("cached", str(cached).lower())
        self.mlflow.log_params(redacted(stage_params(record)))
        self.mlflow.log_metrics(stage_metrics(record))
        if record.error:
            self.mlflow.set_tag("failure", redact(record.error)[:5000])
        if folder.is_dir():
            self.mlflow.log_artifacts(str(folder), artifact_path="results")
            if record.error:
                self.mlflow.end_run(status="FAILED")

    def log_verdict(self, verdict: Verdict, verdict_path: Path, report_dir: Path) -> None:
        from gates.compare import run_metrics, run_tags

        # The same tags and gate.* metrics on every candidate's parent run, so the MLflow UI's
        # compare view shows what `quantgate compare` prints.
        self.mlflow.set_tags(run_tags(verdict))
        self.mlflow.log_metrics(run_metrics(verdict))
        self.mlflow.log_artifact(str(verdict_path))
        self.mlflow.log_artifacts(str(report_dir), artifact_path="report")
        client = self.mlflow.tracking.MlflowClient()
        for stage in verdict.stages:
            runs = client.search_runs(
                [self.mlflow.active_run().info.experiment_id],
                filter_string=f"tags.mlflow.parentRunId = '{self.parent_run_id}' "
                f"and tags.stage = '{stage.stage}'",
            )
            for run in runs:
                client.set_tag(run.info.run_id, "verdict", "pass" if stage.passed else "fail")
