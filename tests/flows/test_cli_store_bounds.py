"""Every wait on an MLflow store is bounded: a database nobody listens on, one that never
answers its login, an HTTP server that stops answering after its health check, each end in one
line naming the address (its password masked), exit 2, and nothing written."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from typer.testing import CliRunner

from flows import tracking
from flows.cli import app
from infra.ports import free_port
from tests.flows.test_cli_stores import files
from tests.flows.test_service_edges import silent_port

SECRET = "pw-7f3a9c1e"
runner = CliRunner()


@pytest.fixture
def here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("MLFLOW_TRACKING_URI", "QG_MLFLOW_TRACKING_URI", "PREFECT_API_URL",
                 "MLFLOW_HTTP_REQUEST_TIMEOUT", "MLFLOW_HTTP_REQUEST_MAX_RETRIES"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("QG_STATE_DIR", str(tmp_path / ".quantgate"))
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    monkeypatch.setattr(tracking, "PROBE_TIMEOUT_S", 1.0)
    monkeypatch.setattr(tracking, "HTTP_TIMEOUT_S", 1.0)
    return tmp_path


def one_line(args: list[str], uri: str) -> str:
    result = runner.invoke(app, args, env={"COLUMNS": "400", "MLFLOW_TRACKING_URI": uri})
    lines = [line for line in result.output.splitlines()
             if line.strip() and "INFO mlflow" not in line]
    assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "), \
        (result.output, repr(result.exception))
    assert SECRET not in result.output and "Traceback" not in result.output
    return lines[0]


@contextmanager
def healthy_then_silent() -> Iterator[str]:
    """An MLflow look-alike: /health answers, every API call is held open until the test ends."""
    release = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def do_GET(self) -> None:
            if self.path.startswith("/health"):
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"OK")
                return
            release.wait(30)

        do_POST = do_GET

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        release.set()
        server.shutdown()
        server.server_close()


COMMANDS = [["compare"], ["promote", "m", "1"], ["rollback", "m"]]


@pytest.mark.parametrize("args", COMMANDS)
def test_a_database_nobody_listens_on_is_named(here, args):
    port = free_port()
    line = one_line(args, f"postgresql+psycopg2://mlflow:{SECRET}@127.0.0.1:{port}/mlflow")
    assert line.startswith(f"error: MLFLOW_TRACKING_URI=postgresql+psycopg2://mlflow:<redacted>@"
                           f"127.0.0.1:{port}/mlflow: nothing answers at 127.0.0.1:{port} "), line
    assert line.endswith("start the database, or set MLFLOW_TRACKING_URI (or "
                         "QG_MLFLOW_TRACKING_URI) to another store"), line
    assert files(here) == set()


def test_a_database_that_never_answers_its_login_is_given_up_on(here):
    pytest.importorskip("psycopg2")  # the driver that bounds its login by connect_timeout
    with silent_port() as port:
        line = one_line(["compare"], f"postgresql+psycopg2://mlflow:{SECRET}@127.0.0.1:{port}/m")
    assert f"the database at 127.0.0.1:{port} does not let MLflow in (" in line, line
    assert files(here) == set()


def test_a_database_driver_that_is_not_installed_is_named(here):
    line = one_line(["compare"], f"postgresql+nodriver://mlflow:{SECRET}@127.0.0.1:1/m")
    assert "its database driver cannot be loaded (" in line and "nodriver): install it" in line


@pytest.mark.parametrize("args", COMMANDS)
def test_a_server_that_stops_answering_after_its_health_check_is_given_up_on(here, args):
    with healthy_then_silent() as url:
        line = one_line(args, url)
    assert url in line and ("timed out" in line or "Read timed out" in line), line
    assert files(here) == set()


@pytest.mark.parametrize(("uri", "problem"), [
    ("http://[::1", "not a URL (Invalid IPv6 URL): correct it"),
    ("http://127.0.0.1:99999", "not a URL (Port out of range 0-65535): correct it"),
    (f"postgresql://mlflow:{SECRET}@[::1/db", "not a database URI ("),
])
@pytest.mark.parametrize("args", [["compare"], ["rollback", "m"]])
def test_a_malformed_store_uri_is_one_line(here, uri, problem, args):
    line = one_line(args, uri)
    assert line.startswith(f"error: MLFLOW_TRACKING_URI={uri.replace(SECRET, '<redacted>')}: "
                           f"{problem}"), line
    assert files(here) == set()


def test_a_run_is_refused_a_malformed_store_uri_before_it_starts(tmp_path):
    from flows.settings import Settings, SettingsError, check_writable

    settings = Settings(mlflow_tracking_uri="http://[::1", results_dir=tmp_path / "results",
                        reports_dir=tmp_path / "reports", cache_dir=tmp_path / "cache")
    with pytest.raises(SettingsError, match=r"MLFLOW_TRACKING_URI=http://\[::1: not a URL "):
        check_writable(settings)
