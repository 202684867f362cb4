import pytest

from flows.tracking import Tracker


def test_stage_runs_are_open_while_measured_and_fail_with_the_stage(tmp_path):
    import mlflow

    tracker = Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "t")
    with pytest.raises(RuntimeError), tracker.candidate_run("c", {"uri": "http://u:pw-123456@h"}):
        with tracker.stage_run("c", "baseline", "baseline") as first:
            assert mlflow.active_run().info.run_id == first
        with tracker.stage_run("c", "w8", "weights"):
            raise RuntimeError("engine died")
    runs = mlflow.search_runs(experiment_names=["t"]).set_index("tags.mlflow.runName")
    assert runs.loc["c/baseline", "status"] == "FINISHED"
    assert runs.loc["c/w8", "status"] == "FAILED"
    assert runs.loc["c/w8", "tags.failure"] == "RuntimeError: engine died"
    assert runs.loc["c", "status"] == "FAILED"
    assert runs.loc["c", "params.uri"] == "http://u:<redacted>@h"
