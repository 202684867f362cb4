"""MLflow logging: a parent run per candidate, a nested run per stage, stable metric names."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from gates.record import StageRecord
from gates.verdict import Verdict
from infra.secrets import redact

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
