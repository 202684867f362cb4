"""`status`, `submit` and `load-ui` on a dead, silent or garbled service: exit 2 and one line
that names the address or file and what to do, within a bounded time (no hang, no traceback)."""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from typer.testing import CliRunner

from flows import service
from flows.cli import app
from infra.ports import free_port
from tests.fake_openai import FakeOpenAI

ADDRESS_ENV = ("PREFECT_API_URL", "MLFLOW_TRACKING_URI")


@pytest.fixture
def state_dir(tmp_path, monkeypatch):
    """The service's state folder, with no service address in the environment; Prefect's
    settings are read again afterwards (the commands point it at the addresses they try)."""
    saved = {name: os.environ.pop(name, None) for name in ADDRESS_ENV}
    monkeypatch.setenv("QG_STATE_DIR", str(tmp_path / ".quantgate"))
    yield tmp_path / ".quantgate"
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    if "prefect.context" in sys.modules:
        from prefect.context import refresh_global_settings_context

        refresh_global_settings_context()


def write_address(state_dir, prefect: str, mlflow: str) -> str:
    return str(service.write_address(state_dir, prefect, mlflow))


def invoke(args: list[str], timeout_s: float = 60, env: dict | None = None):
    """The command's result; a command still running after `timeout_s` fails the test."""
    box = {}
    thread = threading.Thread(target=lambda: box.update(result=CliRunner().invoke(
        app, args, env={"COLUMNS": "400", **(env or {})})), daemon=True)
    started = time.monotonic()
    thread.start()
    thread.join(timeout_s)
    assert not thread.is_alive(), f"quantgate {' '.join(args)} still running after {timeout_s} s"
    result = box["result"]
    result.seconds = time.monotonic() - started
    return result


def one_line(result) -> str:
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "), \
        (result.exit_code, result.output, result.exception)
    assert "Traceback" not in result.output
    return lines[0]


class Stub:
    """An HTTP server that answers the health checks of Prefect and MLflow, Prefect's list of
    flow runs (empty), CSRF token (none) and, with `missing_deployment`, deployment (not found),
    and holds every other request open until the test ends."""

    def __init__(self, missing_deployment: bool = False) -> None:
        self.release = threading.Event()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def answer(self, body: str) -> None:
                data = body.encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path.endswith("/health"):
                    return self.answer("true")
                # 404: what an older Prefect answers for a CSRF token, and any for a deployment
                # it does not have.
                if self.path.startswith("/api/csrf-token") or (
                        missing_deployment and self.path.startswith("/api/deployments/name/")):
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return None
                stub.release.wait(30)
                return None

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                if self.path == "/api/flow_runs/filter":
                    return self.answer("[]")
                stub.release.wait(30)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    @contextmanager
    def running(self) -> Iterator[Stub]:
        thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self.release.set()
            self.server.shutdown()
            self.server.server_close()


@contextmanager
def silent_port() -> Iterator[int]:
    """A port that accepts connections (the kernel's backlog) and never answers."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield listener.getsockname()[1]


@pytest.mark.parametrize("command", [["status"], ["submit", "spec.yaml"]])
def test_a_dead_prefect_address_says_which_and_what_to_do(state_dir, command):
    prefect = f"http://127.0.0.1:{free_port()}/api"
    path = write_address(state_dir, prefect, f"http://127.0.0.1:{free_port()}")
    line = one_line(invoke(command))
    assert f"the Prefect API at {prefect} (from {path}) is not answering" in line
    assert "start `quantgate serve` again" in line and f"delete {path}" in line


@pytest.mark.parametrize("command", [["status"], ["submit", "spec.yaml"]])
def test_a_dead_mlflow_address_says_which_and_what_to_do(state_dir, command):
    mlflow = f"http://127.0.0.1:{free_port()}"
    with Stub().running() as prefect:
        path = write_address(state_dir, f"{prefect.url}/api", mlflow)
        line = one_line(invoke(command))
    assert f"the MLflow server at {mlflow} (from {path}) is not answering" in line
    assert "start `quantgate serve` again" in line


def test_a_dead_address_from_the_environment_names_the_variable(state_dir):
    prefect = f"http://127.0.0.1:{free_port()}/api"
    line = one_line(invoke(["status"], env={"PREFECT_API_URL": prefect,
                                            "MLFLOW_TRACKING_URI": "sqlite:///x.db"}))
    assert f"the Prefect API at {prefect} (from PREFECT_API_URL) is not answering" in line
    assert "unset PREFECT_API_URL" in line


@pytest.mark.parametrize(("content", "problem"), [
    ("{garbled", " is not a service address file (Expecting property name"),
    ("", " is not a service address file (Expecting value"),
    ("[1, 2]", " is not a service address file (a JSON object with prefect_api_url"),
    ('{"mlflow_tracking_uri": "http://127.0.0.1:5000"}', ": prefect_api_url is missing"),
    ('{"prefect_api_url": "http://127.0.0.1:4200/api"}', ": mlflow_tracking_uri is missing"),
    ('{"prefect_api_url": "127.0.0.1:4200", "mlflow_tracking_uri": "http://127.0.0.1:5000"}',
     ": prefect_api_url is '127.0.0.1:4200', not an http(s) URL"),
    ('{"prefect_api_url": 4200, "mlflow_tracking_uri": "http://127.0.0.1:5000"}',
     ": prefect_api_url is 4200, not an http(s) URL"),
])
@pytest.mark.parametrize("command", [["status"], ["submit", "spec.yaml"]])
def test_a_garbled_address_file_says_delete_it(state_dir, content, problem, command):
    state_dir.mkdir(parents=True)
    path = state_dir / service.ADDRESS_FILE
    path.write_text(content)
    line = one_line(invoke(command))
    assert f"{path}{problem}" in line
    assert f"delete {path} and start `quantgate serve` again" in line


def test_a_server_that_never_answers_is_given_up_on(state_dir, monkeypatch):
    monkeypatch.setattr(service, "PROBE_TIMEOUT_S", 0.5)
    with silent_port() as port:
        path = write_address(state_dir, f"http://127.0.0.1:{port}/api",
                             f"http://127.0.0.1:{free_port()}")
        result = invoke(["status"], timeout_s=30)
    line = one_line(result)
    assert f"the Prefect API at http://127.0.0.1:{port}/api (from {path}) is not answering " \
           "(no answer within 0.5 s)" in line
    assert result.seconds < 15


def test_mlflow_calls_after_the_health_check_are_bounded(state_dir, monkeypatch):
    monkeypatch.setattr(service, "REQUEST_TIMEOUT_S", 1.0)
    with Stub().running() as stub:  # Prefect lists no runs; MLflow's experiment lookup hangs
        write_address(state_dir, f"{stub.url}/api", f"{stub.url}/mlflow")
        result = invoke(["status"], timeout_s=60)
    assert f"the MLflow server at {stub.url}/mlflow failed" in one_line(result)
    assert result.seconds < 30
    assert "MLFLOW_HTTP_REQUEST_TIMEOUT" not in os.environ, "the bound outlived the call"


@pytest.mark.parametrize(("missing", "problem"), [
    (False, "did not answer within 1 s"),
    (True, "has no deployment acceptance/quantgate: start `quantgate serve`"),
])
def test_submits_prefect_calls_are_bounded(state_dir, monkeypatch, tmp_path, missing, problem):
    monkeypatch.setattr(service, "REQUEST_TIMEOUT_S", 1.0)
    with Stub(missing_deployment=missing).running() as stub:
        os.environ.update(PREFECT_API_URL=f"{stub.url}/api", MLFLOW_TRACKING_URI=f"{stub.url}/m")
        service.use_service(state_dir, probe=True)
        started = time.monotonic()
        with pytest.raises(service.ServiceError, match=f"the Prefect API at {stub.url}/api {problem}"):
            service.submit(tmp_path / "spec.yaml")
    assert time.monotonic() - started < 30


def test_the_address_file_serve_writes_is_read_back(state_dir):
    path = write_address(state_dir, "http://127.0.0.1:4200/api", "http://127.0.0.1:5000")
    assert service.read_address(state_dir / service.ADDRESS_FILE) == {
        "prefect_api_url": "http://127.0.0.1:4200/api", "mlflow_tracking_uri": "http://127.0.0.1:5000"}
    assert json.loads(open(path).read())["pid"] == os.getpid()


@pytest.fixture
def no_locust(monkeypatch):
    """open_webui recorded, never run: a URL that got past the check shows here, not as a hang."""
    opened: list[str] = []
    monkeypatch.setattr("load.webui.open_webui", lambda url, *a, **k: opened.append(url))
    return opened


@pytest.mark.parametrize(("base_url", "problem"), [
    ("not a url", "--base-url 'not a url' is not an http(s) URL with a host, e.g. http://"),
    ("localhost:8000", "--base-url 'localhost:8000' is not an http(s) URL with a host"),
    ("http://[::1", "--base-url 'http://[::1' is not an http(s) URL with a host"),
    ("http://127.0.0.1:port", "is not an http(s) URL with a host"),
])
def test_load_ui_refuses_a_base_url_that_is_not_a_url(no_locust, base_url, problem):
    line = one_line(invoke(["load-ui", "--base-url", base_url, "--model", "m"], timeout_s=30))
    assert problem in line and no_locust == []


def test_load_ui_refuses_a_base_url_nothing_answers(no_locust):
    url = f"http://127.0.0.1:{free_port()}"
    line = one_line(invoke(["load-ui", "--base-url", url, "--model", "m"], timeout_s=30))
    assert f"no OpenAI-compatible server answers at {url}" in line and "start the stage" in line
    assert no_locust == []


def test_load_ui_gives_up_on_a_server_that_never_answers(no_locust, monkeypatch):
    monkeypatch.setattr("infra.external_engine.PROBE_TIMEOUT_S", 0.5)
    with silent_port() as port:
        result = invoke(["load-ui", "--base-url", f"http://127.0.0.1:{port}", "--model", "m"],
                        timeout_s=30)
    assert "did not list its models within 0.5 s" in one_line(result) and result.seconds < 15


def test_load_ui_names_the_models_a_server_serves(no_locust):
    with FakeOpenAI() as server:
        line = one_line(invoke(["load-ui", "--base-url", server.base_url, "--model", "fake-mdl"],
                               timeout_s=30))
        assert f"the server at {server.base_url} serves ['fake-model'], not --model 'fake-mdl'; " \
               "did you mean 'fake-model'?" in line
        assert no_locust == []
        assert invoke(["load-ui", "--base-url", server.base_url, "--model", "fake-model"],
                      timeout_s=30).exit_code == 0
        assert no_locust == [server.base_url]


def test_a_service_failure_leaves_the_registered_version_for_the_next_poll(monkeypatch, tmp_path):
    from flows import preflight, registry

    candidate = type("Candidate", (), {"key": "m@4"})()
    marked: list[str] = []
    monkeypatch.setattr(registry, "poll", lambda client, watched, seen: [candidate])
    monkeypatch.setattr(registry, "materialize", lambda candidate, folder: tmp_path / "spec.yaml")
    monkeypatch.setattr(registry, "mark", lambda client, candidate, status, **tags:
                        marked.append(status))
    monkeypatch.setattr(preflight, "Prepared", lambda spec, engine_host=True: None)

    def unreachable(*args, **kwargs):
        raise service.ServiceError("the Prefect API at http://127.0.0.1:1/api did not answer")

    monkeypatch.setattr(service, "submit", unreachable)
    seen, lines = {"m@4", "m@3"}, []
    assert service.intake(None, ["m"], seen, tmp_path, lines.append) == []
    assert marked == [] and seen == {"m@3"}
    assert lines == ["m@4: not queued yet: the Prefect API at http://127.0.0.1:1/api did not answer"]
