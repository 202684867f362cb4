"""The service's queue on a real Prefect server and registry on a real MLflow server (no engine,
no worker: runs stay scheduled, which is what a queue shows)."""

from __future__ import annotations

import asyncio
import os

import pytest

from flows import service
from flows.host import host_limit
from infra.servers import MlflowServer, PrefectServer
from tests.flows.checkpoints import W8A16, make_checkpoint, make_emulated_checkpoint

SPEC = """
candidate: c
baseline: {{checkpoint: {base}}}
stages: [{{name: w8, kind: weights, checkpoint: {w8}}}]
evalsets: [{{name: math, limit: 60}}]
load_profile: ci
"""


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    folder = tmp_path_factory.mktemp("service-queue")
    from prefect.context import refresh_global_settings_context

    saved = {k: os.environ.get(k) for k in ("PREFECT_API_URL", "MLFLOW_TRACKING_URI")}
    with PrefectServer(folder / "prefect") as prefect, MlflowServer.local(folder / "mlflow") as ml:
        service.point_prefect_at(prefect.api_url)  # Prefect was imported by earlier tests
        os.environ["MLFLOW_TRACKING_URI"] = ml.tracking_uri
        service.deploy()
        yield folder, ml.tracking_uri
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    refresh_global_settings_context()


@pytest.fixture
def spec(tmp_path):
    base = make_checkpoint(tmp_path / "bf16")
    w8 = make_emulated_checkpoint(tmp_path / "w8", "w8a16", W8A16)
    path = tmp_path / "spec.yaml"
    path.write_text(SPEC.format(base=base, w8=w8))
    return path


def state(run_id: str) -> str:
    async def read():
        from prefect.client.orchestration import get_client

        async with get_client() as client:
            return (await client.read_flow_run(run_id)).state.type.value

    return asyncio.run(read())


def test_deploy_creates_the_pool_and_the_host_limit(servers):
    async def read():
        from prefect.client.orchestration import get_client

        async with get_client() as client:
            pool = await client.read_work_pool(service.POOL)
            limit = await client.read_global_concurrency_limit_by_name(host_limit())
            deployment = await client.read_deployment_by_name(f"{service.FLOW}/{service.DEPLOYMENT}")
            return pool.type, limit.limit, deployment.work_pool_name

    assert asyncio.run(read()) == ("process", 1, service.POOL)


def test_a_slot_left_by_an_acceptance_that_died_with_its_service_is_given_back(servers):
    """A service killed past its grace period leaves its running acceptance's host slot taken,
    and the lease that would expire it lived in that Prefect server's memory: without this,
    every run queued after the restart waits for ever (seen in the end-to-end service story)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitUpdate

    async def slots(taken: int | None = None) -> int:
        async with get_client() as client:
            if taken is not None:
                await client.update_global_concurrency_limit(
                    host_limit(), GlobalConcurrencyLimitUpdate(active_slots=taken))
            return (await client.read_global_concurrency_limit_by_name(host_limit())).active_slots

    assert asyncio.run(slots(taken=1)) == 1
    said: list[str] = []
    service.deploy(said.append)
    assert asyncio.run(slots()) == 0
    assert said and "1 slot(s) left taken" in said[0] and "given back" in said[0]
    service.deploy(said.append)  # nothing taken: nothing said
    assert len(said) == 1


def test_the_same_key_is_the_same_run_and_a_crashed_one_resumes(servers, spec):
    first, what = service.submit(spec, key="m@1", registry_version="m@1")
    assert what == "scheduled" and state(first) == "SCHEDULED"
    again, what = service.submit(spec, key="m@1", registry_version="m@1")
    assert again == first and what == "scheduled"

    async def crash():
        from prefect.client.orchestration import get_client
        from prefect.states import Crashed

        async with get_client() as client:
            await client.set_flow_run_state(first, Crashed(), force=True)

    asyncio.run(crash())
    resumed, what = service.submit(spec, key="m@1")
    assert resumed == first and what == "resumed (was crashed)" and state(first) == "SCHEDULED"
    other, _ = service.submit(spec)  # no key: a new run
    assert other != first


def test_runs_left_running_by_our_flow_processes_are_crashed_and_no_others(servers, spec):
    """A flow process killed before it reports stays RUNNING on the server: serve marks it
    crashed when its pid was under our workers, bare (Prefect 3.7) or "host:pid"."""
    import socket

    ours, bare, other_host, other_pid = (service.submit(spec)[0] for _ in range(4))
    host = socket.gethostname()
    pids = {ours: f"{host}:4242", bare: "4243", other_host: "elsewhere:4242", other_pid: "999"}

    async def running():
        from prefect.client.orchestration import get_client
        from prefect.states import Running

        async with get_client() as client:
            for run_id, pid in pids.items():
                await client.update_flow_run(run_id, infrastructure_pid=pid)
                await client.set_flow_run_state(run_id, Running(), force=True)

    asyncio.run(running())
    assert service.crash_leftovers({4242, 4243}) == 2
    assert [state(r) for r in pids] == ["CRASHED", "CRASHED", "RUNNING", "RUNNING"]
    assert service.flow_process_id(None) is None and service.flow_process_id("x:y") is None


def test_status_lists_runs_with_their_registry_version_and_verdict(servers, spec):
    import mlflow

    run_id, _ = service.submit(spec, key="m@2", registry_version="m@2")
    judged, _ = service.submit(spec, key="m@3", registry_version="m@3")
    client = mlflow.MlflowClient(servers[1])
    experiment = client.create_experiment("status-test")
    client.create_run(experiment, tags={"prefect.flow_run_id": judged, "verdict": "go",
                                        "candidate": "m-v3"})
    # A later attempt of the same run that crashed before judging does not hide the verdict.
    client.create_run(experiment, tags={"prefect.flow_run_id": judged, "candidate": "m-v3"})
    rows = {row["id"]: row for row in service.status(servers[1], "status-test")}
    assert rows[run_id]["state"] == "Scheduled" and rows[run_id]["registry"] == "m@2"
    assert rows[run_id]["verdict"] == "-" and rows[run_id]["spec"] == "spec.yaml"
    assert rows[judged]["verdict"] == "go" and rows[judged]["candidate"] == "m-v3"


def test_a_registered_version_is_queued_once_and_a_bad_one_is_tagged(servers, spec, tmp_path):
    import mlflow

    from flows.registry import register_checkpoint

    client = mlflow.MlflowClient(servers[1])
    client.create_registered_model("svc", tags={"quantgate.spec": str(spec)})
    good = register_checkpoint(client, "svc", tmp_path / "w8")
    seen: set[str] = set()
    lines: list[str] = []
    queued = service.intake(client, ["svc"], seen, tmp_path / "specs", lines.append)
    assert len(queued) == 1 and state(queued[0]) == "SCHEDULED", lines
    assert service.intake(client, ["svc"], set(), tmp_path / "specs", lines.append) == []
    tags = client.get_model_version("svc", good.version).tags
    assert tags["quantgate.status"] == "queued" and tags["quantgate.flow_run_id"] == queued[0]

    bad = register_checkpoint(client, "svc", tmp_path / "w8",
                              tags={"quantgate.spec": str(tmp_path / "missing.yaml")})
    assert service.intake(client, ["svc"], set(), tmp_path / "specs", lines.append) == []
    assert client.get_model_version("svc", bad.version).tags["quantgate.status"] == "error"
