"""Real Prefect, MLflow and Postgres servers: start, answer, keep what a client writes, stop cleanly."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from infra.postgres import LocalPostgres, postgres_bin_dir, reachable_bin_dir, unsearchable
from infra.servers import MlflowServer, PrefectServer, ServiceError

FLOW = textwrap.dedent(
    """
    from prefect import flow

    @flow(name="qg-ping")
    def ping(x: int) -> int:
        return x + 1

    assert ping(41) == 42
    """
)


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


@pytest.fixture
def postgres_dir() -> Iterator[Path]:
    # Not tmp_path: under root, Postgres runs as `nobody`, who cannot enter pytest's 0700 base folder.
    with tempfile.TemporaryDirectory(prefix="qg-pg-") as folder:
        os.chmod(folder, 0o755)
        yield Path(folder)


@pytest.fixture(params=["sqlite", "postgres"])
def prefect_database(request: pytest.FixtureRequest, postgres_dir: Path) -> Iterator[str | None]:
    """None: the server's own SQLite file; else the scale-out backend, a real Postgres."""
    if request.param == "sqlite":
        yield None
        return
    with LocalPostgres(postgres_dir / "pg", database="prefect") as postgres:
        yield postgres.async_uri


def test_prefect_server_runs_a_flow_visible_to_the_client(
    prefect_database: str | None, tmp_path: Path
) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName
    from prefect.settings import PREFECT_API_URL, temporary_settings

    home = tmp_path / "prefect"
    with PrefectServer(home, database_url=prefect_database) as server:
        assert server.startup_s is not None and server.startup_s < 90
        assert httpx.get(f"{server.api_url}/health", timeout=5).json() is True
        client_env = os.environ | {
            "PREFECT_API_URL": server.api_url,
            "PREFECT_HOME": str(tmp_path / "client"),
        }
        done = subprocess.run(
            [sys.executable, "-c", FLOW], env=client_env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr[-2000:]

        with temporary_settings({PREFECT_API_URL: server.api_url}), get_client(sync_client=True) as client:
            runs = client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=["qg-ping"])))
        assert [run.state.type.value for run in runs] == ["COMPLETED"]
        assert runs[0].parameters == {"x": 41}
    assert not server.alive()
    assert (home / "prefect.db").exists() == (prefect_database is None)


def test_mlflow_server_on_sqlite_keeps_a_run_and_its_artifact(tmp_path: Path) -> None:
    from mlflow import MlflowClient

    with MlflowServer.local(tmp_path / "state") as server:
        client = MlflowClient(tracking_uri=server.tracking_uri)
        experiment = client.create_experiment("qg-sqlite")
        run = client.create_run(experiment)
        client.log_param(run.info.run_id, "stage", "baseline")
        client.log_metric(run.info.run_id, "ttft_p95_ms", 12.5)
        client.log_text(run.info.run_id, "go", "verdict.txt")
        client.set_terminated(run.info.run_id)

        stored = client.get_run(run.info.run_id)
        assert stored.data.params == {"stage": "baseline"}
        assert stored.data.metrics == {"ttft_p95_ms": 12.5}
        fetched = client.download_artifacts(run.info.run_id, "verdict.txt", str(tmp_path))
        assert Path(fetched).read_text() == "go"
    # The artifact went through the server's proxy into its own folder, not the client's.
    assert list((tmp_path / "state" / "artifacts").rglob("verdict.txt"))
    assert (tmp_path / "state" / "mlflow.db").exists()


def test_mlflow_server_on_postgres_keeps_the_registry(postgres_dir: Path) -> None:
    import psycopg2
    from mlflow import MlflowClient

    with LocalPostgres(postgres_dir / "pg") as postgres:
        assert postgres.uri.startswith("postgresql+psycopg2://")
        with MlflowServer(
            postgres.uri, postgres_dir / "artifacts", log=postgres_dir / "mlflow.log"
        ) as server:
            client = MlflowClient(tracking_uri=server.tracking_uri)
            run = client.create_run(client.create_experiment("qg-postgres"))
            client.log_metric(run.info.run_id, "kl_mean", 0.034)
            checkpoint = postgres_dir / "checkpoint"
            checkpoint.mkdir()
            (checkpoint / "config.json").write_text('{"model_type": "llama"}')
            client.log_artifacts(run.info.run_id, str(checkpoint), "model")
            client.set_terminated(run.info.run_id)
            client.create_registered_model("smollm2-135m")
            version = client.create_model_version(
                "smollm2-135m", source=f"{run.info.artifact_uri}/model", run_id=run.info.run_id
            )
            client.set_registered_model_alias("smollm2-135m", "champion", version.version)

            champion = client.get_model_version_by_alias("smollm2-135m", "champion")
            assert (champion.version, champion.run_id) == ("1", run.info.run_id)
            assert client.get_run(run.info.run_id).data.metrics == {"kl_mean": 0.034}

            # What a serving host runs: the champion's files by alias, from the registry alone.
            served = postgres_dir / "served"
            env = os.environ | {
                "MLFLOW_TRACKING_URI": server.tracking_uri,
                "MLFLOW_DISABLE_TELEMETRY": "true",
            }
            download = [sys.executable, "-m", "mlflow", "artifacts", "download"]
            download += ["--artifact-uri", "models:/smollm2-135m@champion", "--dst-path", str(served)]
            done = subprocess.run(download, env=env, capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, done.stderr[-2000:]
            assert (served / "config.json").read_text() == '{"model_type": "llama"}'

        # The registry really lives in Postgres, and survives the MLflow server.
        connection = psycopg2.connect(
            host=postgres.host, port=postgres.port, user="postgres", dbname="mlflow"
        )
        with connection, connection.cursor() as cursor:
            cursor.execute("SELECT name, alias, version FROM registered_model_aliases")
            assert cursor.fetchall() == [("smollm2-135m", "champion", 1)]
        connection.close()
    assert not (postgres_dir / "pg" / "pgdata" / "postmaster.pid").exists()


@pytest.mark.parametrize("kind", ["prefect", "mlflow", "postgres"])
def test_a_taken_port_is_one_clear_error(kind: str, taken_port: int, tmp_path: Path) -> None:
    servers = {
        "prefect": lambda: PrefectServer(tmp_path / "prefect", port=taken_port),
        "mlflow": lambda: MlflowServer.local(tmp_path / "mlflow", port=taken_port),
        "postgres": lambda: LocalPostgres(tmp_path / "pg", port=taken_port),
    }
    with pytest.raises(ServiceError, match=f"port {taken_port} on 127.0.0.1 is already in use"):
        servers[kind]().start()
    assert not (tmp_path / "pg").exists()


def test_a_server_that_dies_at_start_up_shows_its_log(tmp_path: Path) -> None:
    server = MlflowServer("nosuchscheme://nowhere", tmp_path / "artifacts")
    with pytest.raises(ServiceError, match="exited with code") as failure:
        server.start()
    assert "nosuchscheme" in str(failure.value)
    assert not server.alive()


def test_unsearchable_names_the_folder_another_account_cannot_enter(postgres_dir: Path) -> None:
    outer, inner = postgres_dir / "outer", postgres_dir / "outer" / "inner"
    inner.mkdir(parents=True)
    stranger = (os.getuid() + 1, os.getgid() + 1)
    outer.chmod(0o711)
    assert unsearchable(inner, *stranger) is None
    outer.chmod(0o700)
    assert unsearchable(inner, *stranger) == outer
    assert unsearchable(inner, os.getuid(), os.getgid()) is None


def test_binaries_out_of_reach_are_copied_where_the_account_can_run_them(tmp_path: Path) -> None:
    installed = postgres_bin_dir()
    site_packages = installed.parents[2]
    hidden = tmp_path / "hidden"  # site-packages under a 0700 folder, as in a venv under /root
    for tree in [installed.parents[1], *site_packages.glob("pgserver*.libs")]:
        shutil.copytree(tree, hidden / tree.name, symlinks=True)
    hidden.chmod(0o700)
    hidden_bin = hidden / installed.relative_to(site_packages)
    stranger = (os.getuid() + 1, os.getgid() + 1)

    bin_dir = reachable_bin_dir(hidden_bin, *stranger)
    try:
        assert unsearchable(bin_dir, *stranger) is None
        assert reachable_bin_dir(hidden_bin, *stranger) == bin_dir  # copied once
        # initdb needs the wheel's libpq: it loads only if the libraries came along.
        version = subprocess.run([bin_dir / "initdb", "--version"], capture_output=True, text=True)
        assert version.stdout.startswith("initdb (PostgreSQL) 18"), version.stderr
    finally:
        shutil.rmtree(bin_dir.parents[2])
