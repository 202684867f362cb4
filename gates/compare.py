"""Candidates side by side from MLflow: what each candidate run logs, and the table that reads it back."""

from __future__ import annotations

import math

import pandas as pd

from gates.verdict import StageVerdict, Verdict
from infra.errors import QuantgateError, SpecError, did_you_mean

# Tags on the candidate (parent) run; the MLflow UI compare view shows them as rows too.
TAGS = ("verdict", "stage_kind", "precision", "accepted_stage", "candidate_hash")


def _final(verdict: Verdict) -> StageVerdict:
    return verdict.stages[-1]


def run_tags(verdict: Verdict) -> dict[str, str]:
    """Tags for the candidate's parent run: verdict, stage_kind and candidate, plus a few more."""
    final = _final(verdict)
    return {
        "candidate": verdict.candidate, "verdict": verdict.decision, "stage_kind": final.kind,
        "precision": str(final.precision), "accepted_stage": str(verdict.accepted_stage),
        "candidate_hash": str(verdict.candidate_hash),
    }


def run_metrics(verdict: Verdict) -> dict[str, float]:
    """The candidate's figures as flat `gate.*` metrics on its parent run, taken from the verdict.

    Every candidate run logs the same names, so selecting candidate runs in the MLflow UI compare
    view gives the same table as `quantgate compare`.
    """
    final = _final(verdict)
    out: dict[str, float | None] = {
        "gate.go": 1.0 if verdict.decision == "go" else 0.0,
        "gate.blocking_checks": float(sum(len(s.failures) for s in verdict.stages)),
        "gate.advisories": float(len(verdict.advisories)),
    }
    for check in final.checks:
        d = check.details
        if check.rule.startswith("quality.") and "ci_low" in d:
            name = check.rule.removeprefix("quality.")
            for key in ("difference", "ci_low", "ci_high", "power", "broke", "fixed", "p_holm",
                        "stage_accuracy", "baseline_accuracy"):
                out[f"gate.quality.{name}.{key}"] = d.get(key)
        elif check.rule == "divergence.kl":
            out |= {"gate.divergence.mean_kl": d.get("mean_kl"), "gate.divergence.kl_ci_high":
                    d.get("ci_high")}
        elif check.rule == "divergence.top1":
            out |= {"gate.divergence.top1": d.get("top1"), "gate.divergence.top1_ci_low":
                    d.get("ci_low")}
        elif check.rule.startswith("perplexity."):
            out[f"gate.{check.rule}_increase"] = check.value
        elif check.rule == "length" and "ci_low" in d:
            out |= {f"gate.length.ratio{suffix}": math.exp(float(d[key])) for key, suffix in
                    (("mean_log_ratio", ""), ("ci_low", "_ci_low"), ("ci_high", "_ci_high"))}
        elif check.rule == "length.finish":
            out["gate.length.finish_increase"] = check.value
        elif check.rule.startswith("latency.") and check.applicable:
            out[f"gate.{check.rule}_increase"] = check.value
        elif check.rule == "engine":
            out |= {f"gate.engine.{key}": value for key, value in d.items()}
    return {k: float(v) for k, v in out.items()
            if isinstance(v, int | float) and math.isfinite(float(v))}


def compare(tracking_uri: str, experiment: str, candidates: list[str] | None = None) -> pd.DataFrame:
    """One column per candidate (its latest finished run), one row per tag and `gate.*` metric."""
    import mlflow
    from mlflow.exceptions import MlflowException

    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(tracking_uri)  # mlflow.search_runs reads the global URI
    try:
        return _compare(mlflow, tracking_uri, experiment, candidates)
    except MlflowException as err:  # a file store, a URI without a registry: MLflow refuses it
        message = " ".join(str(err.message).split()).rstrip(".")
        raise QuantgateError(f"MLflow store {tracking_uri}: {message}; set MLFLOW_TRACKING_URI "
                             "to a database (sqlite:///mlflow.db) or an MLflow server") from err
    finally:
        mlflow.set_tracking_uri(previous)


def _compare(mlflow, tracking_uri: str, experiment: str, candidates: list[str] | None) -> pd.DataFrame:
    client = mlflow.tracking.MlflowClient()
    if client.get_experiment_by_name(experiment) is None:
        names = [e.name for e in client.search_experiments()]
        raise SpecError(f"no MLflow experiment {experiment!r} at {tracking_uri}; "
                        f"{did_you_mean(experiment, names) if names else 'there are none'}")
    runs = mlflow.search_runs(experiment_names=[experiment], output_format="pandas")
    if "tags.verdict" not in runs or "tags.candidate" not in runs:
        raise QuantgateError(f"experiment {experiment!r} has no candidate run with a verdict yet")
    parents = runs["tags.mlflow.parentRunId"].isna() if "tags.mlflow.parentRunId" in runs else True
    runs = runs[parents & runs["tags.verdict"].isin(["go", "rollback"])]
    known = sorted(runs["tags.candidate"].dropna().unique())
    if candidates:
        unknown = [c for c in candidates if c not in known]
        if unknown:
            raise SpecError(f"no finished run for candidate {unknown[0]!r}; "
                            f"{did_you_mean(unknown[0], known) if known else 'none has finished'}")
        runs = runs[runs["tags.candidate"].isin(candidates)]
    if runs.empty:
        raise QuantgateError(f"experiment {experiment!r} has no candidate run with a verdict yet")
    latest = runs.sort_values("start_time", ascending=False).drop_duplicates("tags.candidate")
    order = candidates or list(latest["tags.candidate"])
    latest = latest.set_index("tags.candidate").loc[order]
    columns = [f"tags.{t}" for t in TAGS if f"tags.{t}" in latest] + sorted(
        c for c in latest.columns if c.startswith("metrics.gate.") and latest[c].notna().any())
    table = latest[columns].T
    table.index = [c.split(".", 1)[1] for c in columns]
    table.loc["run_id"] = list(latest["run_id"])
    table.columns.name = "candidate"
    return table
