"""`status` reads the service's MLflow store: a local one from the environment that is not
there is refused in one line, not created."""

from __future__ import annotations

from tests.flows.test_service_edges import Stub, invoke, one_line, state_dir  # noqa: F401


def test_status_does_not_create_a_store_that_is_not_there(state_dir, tmp_path):  # noqa: F811
    store = tmp_path / "elsewhere.db"
    with Stub().running() as stub:  # a Prefect that answers, with no runs
        result = invoke(["status"], env={"PREFECT_API_URL": f"{stub.url}/api",
                                         "MLFLOW_TRACKING_URI": f"sqlite:///{store}"})
    line = one_line(result)
    assert line.startswith(f"error: MLFLOW_TRACKING_URI=sqlite:///{store}: no MLflow store there"), line
    assert not store.exists()
