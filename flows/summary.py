"""The line printed per finished stage, and the tags a run leaves in MLflow and its registry."""

from __future__ import annotations

from pathlib import Path

from flows.settings import Settings
from gates.decide import decide
from gates.length import cut_at_the_budget
from gates.policy import GatePolicy
from gates.record import StageRecord
from gates.verdict import Verdict


def stage_summary(record: StageRecord, so_far: list[StageRecord], policy: GatePolicy,
                  seconds: float, final: bool = True) -> str:
    """One line per finished stage: its key quality numbers, TTFT/TPOT at low load, and the
    rules it already fails against what is measured so far (a stage before the `final` one is
    not held to the candidate's own rule: servable)."""
    parts = [f"stage {record.name} ({record.kind}) done in {seconds:.0f} s"]
    if record.error:
        return f"{parts[0]}: FAILED: {record.error.splitlines()[0][:200]}"
    if record.quality is not None:
        parts.append(", ".join(f"{name} {task.value:.2f} ({len(task.items)})"
                               for name, task in record.quality.tasks.items()))
        if record.quality.divergence is not None:
            parts.append(f"KL {record.quality.divergence.mean_kl:.4f}")
    low = record.load.summaries.get("low") if record.load is not None else None
    if low is not None and low.ttft_p50_ms is not None and low.tpot_p50_ms is not None:
        parts.append(f"TTFT {low.ttft_p50_ms:.0f} ms, TPOT {low.tpot_p50_ms:.1f} ms (low load)")
    if record.parent is None:
        parts += cut_at_the_budget(record, policy)
    else:
        try:
            verdict = decide("so far", so_far, policy)
            mine = next((s for s in verdict.stages if s.stage == record.name), None)
            failed = [check.rule for check in mine.failures
                      if final or check.rule != "servable"] if mine else []
            parts.append(f"failing: {', '.join(failed)}" if failed else "no rule failed yet")
        except Exception as err:  # noqa: BLE001 - a summary line must not end the run
            parts.append(f"rules not judged yet ({type(err).__name__})")
    return "; ".join(parts)


def flow_run_tags() -> dict[str, str]:
    from prefect.runtime import flow_run

    return {"prefect.flow_run_id": str(flow_run.id), "prefect.flow_run_name": str(flow_run.name)}


def tag_registry_version(settings: Settings, registry_version: str, status: str,
                         run: str) -> None:
    import mlflow

    model, _, version = registry_version.rpartition("@")
    client = mlflow.MlflowClient(settings.mlflow_tracking_uri)
    client.set_model_version_tag(model, version, "quantgate.status", status)
    client.set_model_version_tag(model, version, "quantgate.results", run)


def record_registry_verdict(settings: Settings, registry_version: str, verdict: Verdict,
                            report: Path, run_id: str | None) -> None:
    """The A/B switch: on go the version becomes `champion` (the old one `previous`)."""
    import mlflow

    from flows.registry import record_verdict

    model, _, version = registry_version.rpartition("@")
    client = mlflow.MlflowClient(settings.mlflow_tracking_uri)
    record_verdict(client, model, version, verdict.decision, verdict.reasons, str(report),
                   verdict.rollback_command, run_id)
