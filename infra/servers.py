"""Prefect and MLflow servers as subprocesses: logged to a file, polled to health, stopped as a group."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Self

import httpx

from infra.errors import QuantgateError
from infra.ports import free_port, port_free
from infra.process import LoggedProcess
from infra.quiet import quiet


class ServiceError(QuantgateError):
    """A service quantgate runs (Prefect, MLflow, Postgres) could not start, died, or did not answer."""


def check_port(name: str, host: str, port: int) -> None:
    if not port_free(host, port):
        raise ServiceError(
            f"{name}: port {port} on {host} is already in use; stop what holds it, "
            "or pass port=None to take a free one"
        )


def http_ok(url: str) -> bool:
    """Whether `url` answers 200 within two seconds."""
    try:
        return httpx.get(url, timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


def console_command(name: str) -> list[str]:
    """This venv's console script, or `python -m name` where the script is not installed."""
    script = Path(sys.executable).with_name(name)
    return [str(script)] if script.exists() else [sys.executable, "-m", name]


class _Server:
    """One HTTP server subprocess; subclasses give its command, environment and health path."""

    name = "server"
    health_path = "/health"

    def __init__(self, log: Path, host: str, port: int | None, startup_timeout_s: float) -> None:
        self.log = log
        self.host = host
        self.port = free_port(host) if port is None else port
        self.startup_timeout_s = startup_timeout_s
        self.startup_s: float | None = None
        self.process: LoggedProcess | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def command(self) -> list[str]:
        raise NotImplementedError

    def env(self) -> dict[str, str]:
        raise NotImplementedError

    def start(self) -> Self:
        check_port(self.name, self.host, self.port)
        self.log.parent.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        self.process = LoggedProcess(self.command(), self.log, stdin=subprocess.DEVNULL, env=self.env())
        url = self.base_url + self.health_path
        try:
            self.process.wait_ready(
                lambda: http_ok(url), self.startup_timeout_s, lambda what: ServiceError(f"{url}: {what}"),
                died="server exited with code {code} (log {log}):\n{tail}",
                not_ready="no answer after {timeout:g} s (log {log}):\n{tail}")
        except BaseException:
            self.stop()
            raise
        self.startup_s = round(time.monotonic() - started, 1)
        return self

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None:
            process.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class PrefectServer(_Server):
    """`prefect server start` with its own PREFECT_HOME under `home`; SQLite there unless given a database."""

    name = "Prefect server"
    health_path = "/api/health"

    def __init__(
        self,
        home: Path,
        host: str = "127.0.0.1",
        port: int | None = None,
        database_url: str | None = None,
        startup_timeout_s: float = 90.0,
    ) -> None:
        self.home = Path(home).resolve()
        # An async SQLAlchemy URL: postgresql+asyncpg://... for a shared server (LocalPostgres.async_uri).
        self.database_url = database_url or f"sqlite+aiosqlite:///{self.home / 'prefect.db'}"
        super().__init__(self.home / "server.log", host, port, startup_timeout_s)

    @property
    def api_url(self) -> str:
        return f"{self.base_url}/api"

    def command(self) -> list[str]:
        return console_command("prefect") + ["server", "start", "--host", self.host, "--port", str(self.port)]

    def env(self) -> dict[str, str]:
        # The caller's profile or database must not leak in: this server owns everything under home.
        inherited = {k: v for k, v in os.environ.items() if k not in ("PREFECT_PROFILE", "PREFECT_API_KEY")}
        return inherited | {
            "PREFECT_HOME": str(self.home),
            "PREFECT_SERVER_DATABASE_CONNECTION_URL": self.database_url,
            "PREFECT_API_URL": self.api_url,
        } | quiet("PREFECT_SERVER_ANALYTICS_ENABLED", "DO_NOT_TRACK")


class MlflowServer(_Server):
    """`mlflow server` with one worker, proxying artifacts to `artifacts` (a folder or an s3:// URI)."""

    name = "MLflow server"
    health_path = "/health"

    def __init__(
        self,
        backend_uri: str,
        artifacts: Path | str,
        host: str = "127.0.0.1",
        port: int | None = None,
        log: Path | None = None,
        startup_timeout_s: float = 90.0,
    ) -> None:
        self.backend_uri = backend_uri
        self.artifacts = artifacts if "://" in str(artifacts) else str(Path(artifacts).resolve())
        if log is None:
            if "://" in str(artifacts):
                raise ServiceError(f"MLflow server: artifacts {artifacts!r} is a URI; pass log=PATH")
            log = Path(self.artifacts).parent / "mlflow-server.log"
        super().__init__(log, host, port, startup_timeout_s)

    @classmethod
    def local(cls, state_dir: Path, host: str = "127.0.0.1", port: int | None = None) -> MlflowServer:
        """SQLite backend `state_dir/mlflow.db`, artifacts under `state_dir/artifacts`."""
        state_dir = Path(state_dir).resolve()
        return cls(f"sqlite:///{state_dir / 'mlflow.db'}", state_dir / "artifacts", host, port)

    @property
    def tracking_uri(self) -> str:
        return self.base_url

    def command(self) -> list[str]:
        # One worker and no job runner: the defaults spawn 11 processes and triple the start-up on 2 cores.
        return console_command("mlflow") + [
            "server",
            "--backend-store-uri", self.backend_uri,
            "--artifacts-destination", str(self.artifacts),
            "--host", self.host,
            "--port", str(self.port),
            "--workers", "1",
        ]  # fmt: skip

    def env(self) -> dict[str, str]:
        return os.environ | quiet("MLFLOW_DISABLE_TELEMETRY", "DO_NOT_TRACK") | {
            "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
        }
