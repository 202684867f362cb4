"""`serve` told to join a Prefect API or an MLflow server that does not answer says which, in
one line, before it starts anything of its own (their clients would retry it for minutes)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from flows.cli import app
from infra.ports import free_port
from infra.quiet import QUIET_ENV
from tests.flows.test_service_edges import Stub, silent_port


@pytest.fixture
def state_dir(tmp_path, monkeypatch):
    # serve sets these for its workers: the test's own values are given back afterwards.
    for name, value in {**QUIET_ENV, "QG_RESULTS_DIR": str(tmp_path / "results"),
                        "QG_REPORTS_DIR": str(tmp_path / "reports"),
                        "QG_CACHE_DIR": str(tmp_path / "cache")}.items():
        monkeypatch.setenv(name, value)
    for name in ("PREFECT_API_URL", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr("flows.service.PROBE_TIMEOUT_S", 0.5)
    monkeypatch.setenv("QG_STATE_DIR", str(tmp_path / "state"))
    return tmp_path / "state"


def one_line(args: list[str]) -> str:
    result = CliRunner().invoke(app, ["serve", *args], env={"COLUMNS": "400"})
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "), \
        (result.output, repr(result.exception))
    return lines[0]


def test_a_prefect_api_nobody_listens_on_is_refused_before_anything_starts(state_dir):
    url = f"http://127.0.0.1:{free_port()}/api"
    line = one_line(["--prefect-api-url", url])
    assert line.startswith(f"error: the Prefect API at {url} (from --prefect-api-url (or "
                           "PREFECT_API_URL)) is not answering ("), line
    assert line.endswith("start it, or leave --prefect-api-url out to start one here"), line
    assert not state_dir.exists()


def test_an_mlflow_server_that_never_answers_is_refused(state_dir):
    with Stub().running() as prefect, silent_port() as port:  # Prefect answers, MLflow never
        line = one_line(["--prefect-api-url", f"{prefect.url}/api",
                         "--mlflow-uri", f"http://127.0.0.1:{port}"])
    assert line.startswith(f"error: the MLflow server at http://127.0.0.1:{port} (from "
                           "--mlflow-uri (or MLFLOW_TRACKING_URI)) is not answering (no answer "
                           "within 0.5 s)"), line
    assert not state_dir.exists()


def test_a_prefect_api_that_is_not_a_url_is_refused(state_dir):
    line = one_line(["--prefect-api-url", "localhost:4200"])
    assert line == ("error: --prefect-api-url (or PREFECT_API_URL) 'localhost:4200' is not an "
                    "http(s) URL of the Prefect API: start it, or leave --prefect-api-url out to "
                    "start one here"), line
