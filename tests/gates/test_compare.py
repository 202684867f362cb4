"""Candidates side by side from MLflow runs laid out the way the flow logs them."""

from __future__ import annotations

import mlflow
import pytest

from gates.compare import compare, run_metrics, run_tags
from gates.decide import decide
from gates.policy import GatePolicy
from infra.errors import SpecError
from tests.gates.records import UNQUANTIZED, chain, record

BASE = [1.0] * 40 + [0.0] * 60


def log_candidate(verdict) -> None:
    """As flows/ logs a candidate: a parent run with the verdict's tags and gate metrics."""
    with mlflow.start_run(run_name=verdict.candidate, tags={"candidate": verdict.candidate}):
        mlflow.set_tags(run_tags(verdict))
        mlflow.log_metrics(run_metrics(verdict))
        with mlflow.start_run(run_name="stage", nested=True, tags={"stage": "x"}):
            mlflow.log_metric("quality.math.exact_match", 0.4)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    uri = f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment("quantgate")
    good = decide("w8a8", chain(), GatePolicy())
    bad = decide("w4a16", [record("baseline", None, BASE),
                           record("w4", "baseline", [0.0] * 100, kl=0.4, top1=0.7,
                                  axes=UNQUANTIZED | {"weights": "int4/group64"})], GatePolicy())
    log_candidate(good)
    log_candidate(bad)
    mlflow.set_tracking_uri(previous)
    return uri


def test_compare_puts_candidates_side_by_side(store):
    table = compare(store, "quantgate", None)
    assert sorted(table.columns) == ["w4a16", "w8a8"]
    assert table.loc["verdict", "w8a8"] == "go" and table.loc["verdict", "w4a16"] == "rollback"
    assert table.loc["stage_kind", "w8a8"] == "activations"
    assert table.loc["precision", "w4a16"] == "4bit"
    assert float(table.loc["gate.divergence.mean_kl", "w4a16"]) == pytest.approx(0.4)
    assert float(table.loc["gate.quality.math.difference", "w4a16"]) == pytest.approx(-0.4)
    assert float(table.loc["gate.engine.weight_bytes_vs_baseline", "w8a8"]) == pytest.approx(150 / 270)


def test_compare_selects_candidates_in_order_and_names_unknown_ones(store):
    table = compare(store, "quantgate", ["w4a16", "w8a8"])
    assert list(table.columns) == ["w4a16", "w8a8"]
    with pytest.raises(SpecError, match=r"'w8a9'.*did you mean 'w8a8'"):
        compare(store, "quantgate", ["w8a9"])
    with pytest.raises(SpecError, match="no MLflow experiment 'quantgat'"):
        compare(store, "quantgat", None)
