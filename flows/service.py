"""quantgate as a service: the `acceptance` flow as a Prefect deployment on a work pool.

`quantgate serve` starts (or joins) a Prefect server and an MLflow server, deploys the flow to
the work pool `quantgate`, creates this host's concurrency limit (one acceptance at a time per
engine host, however many workers run on it), starts process workers and the registry intake,
and runs until stopped. `submit` queues a run; `status` lists runs with their verdicts. Where
the servers are is kept in `<state_dir>/service.json`, so the other commands find them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

from flows.host import host_limit
from infra.errors import QuantgateError
from infra.servers import ServiceError

REPO = Path(__file__).resolve().parents[1]
POOL = "quantgate"
DEPLOYMENT = "quantgate"
FLOW = "acceptance"
ADDRESS_FILE = "service.json"
ADDRESS_FIELDS = ("prefect_api_url", "mlflow_tracking_uri")
ADDRESS_ENV = {"prefect_api_url": "PREFECT_API_URL", "mlflow_tracking_uri": "MLFLOW_TRACKING_URI"}
PROBE_TIMEOUT_S = 3.0  # a live server answers its health check at once
REQUEST_TIMEOUT_S = 20.0  # each Prefect or MLflow call of `submit` and `status`
# A run in one of these states is finished without a verdict: submitting it again resumes it.
RESUMABLE = ("CRASHED", "FAILED", "CANCELLED")


def write_address(state_dir: Path, prefect_api_url: str, mlflow_uri: str) -> Path:
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / ADDRESS_FILE
    path.write_text(json.dumps({"prefect_api_url": prefect_api_url, "mlflow_tracking_uri":
                                mlflow_uri, "pid": os.getpid()}, indent=1))
    return path


def point_prefect_at(api_url: str) -> None:
    """Talk to this Prefect API from now on. Prefect reads its settings once, when first
    imported: an already-imported Prefect is told to read them again."""
    os.environ["PREFECT_API_URL"] = api_url
    if "prefect.context" in sys.modules:
        from prefect.context import refresh_global_settings_context

        refresh_global_settings_context()


def _is_http_url(url: str) -> bool:
    try:
        parts = urlsplit(url)
        return parts.scheme in ("http", "https") and bool(parts.hostname)
    except ValueError:  # a malformed IPv6 host or port
        return False


def read_address(path: Path) -> dict[str, str]:
    """The servers' addresses `quantgate serve` wrote to `path`, or a ServiceError that names
    the file and how to get a good one."""
    fix = f"delete {path} and start `quantgate serve` again"
    try:
        address = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ServiceError(f"{path} is not a service address file ({err}): {fix}") from err
    if not isinstance(address, dict):
        raise ServiceError(f"{path} is not a service address file (a JSON object with "
                           f"{' and '.join(ADDRESS_FIELDS)}): {fix}")
    for field in ADDRESS_FIELDS:
        value = address.get(field)
        if not isinstance(value, str) or not _is_http_url(value):
            shown = "missing" if value is None else f"{value!r}, not an http(s) URL"
            raise ServiceError(f"{path}: {field} is {shown}: {fix}")
    return {field: address[field] for field in ADDRESS_FIELDS}


def _probe(name: str, url: str, health: str, origin: str, fix: str) -> None:
    """Refuse a server that does not answer its health check within PROBE_TIMEOUT_S."""
    import httpx

    try:
        answer = httpx.get(f"{url.rstrip('/')}{health}", timeout=PROBE_TIMEOUT_S)
    except httpx.TimeoutException:
        reason = f"no answer within {PROBE_TIMEOUT_S:g} s"
    except (httpx.HTTPError, httpx.InvalidURL) as err:
        reason = " ".join(str(err).split()) or type(err).__name__
    else:
        # One that wants credentials is up: its calls carry them.
        if answer.status_code < 400 or answer.status_code in (401, 403):
            return
        reason = f"{health} answers HTTP {answer.status_code}: is it a {name}?"
    raise ServiceError(f"the {name} at {url} ({origin}) is not answering ({reason}): {fix}")


def use_service(state_dir: Path, probe: bool = False) -> dict[str, str]:
    """Point this process at the running service's Prefect and MLflow servers (PREFECT_API_URL
    and MLFLOW_TRACKING_URI, where set, win over the address file). With `probe`, first make
    sure both answer, so a stopped service is one line that says what to do, not a hang."""
    path = state_dir / ADDRESS_FILE
    from_env = {field: os.environ[ADDRESS_ENV[field]] for field in ADDRESS_FIELDS
                if ADDRESS_ENV[field] in os.environ}
    if len(from_env) < len(ADDRESS_FIELDS) and not path.is_file():
        raise ServiceError(f"no service found ({path} does not exist): start `quantgate serve`, "
                           "or set PREFECT_API_URL and MLFLOW_TRACKING_URI")
    address = (read_address(path) if len(from_env) < len(ADDRESS_FIELDS) else {}) | from_env
    if probe:
        for field, name, health in (("prefect_api_url", "Prefect API", "/health"),
                                    ("mlflow_tracking_uri", "MLflow server", "/health")):
            variable = ADDRESS_ENV[field]
            if field not in from_env:
                _probe(name, address[field], health, f"from {path}",
                       f"start `quantgate serve` again, or delete {path} if that service is gone")
            elif _is_http_url(address[field]):
                _probe(name, address[field], health, f"from {variable}",
                       f"start it, or unset {variable} to use the service `quantgate serve` runs")
            elif field == "prefect_api_url":  # MLflow may be a local store (sqlite:///…)
                raise ServiceError(f"{variable}={address[field]!r} is not an http(s) URL: set it to "
                                   "the Prefect API, e.g. http://127.0.0.1:4200/api, or unset it")
    point_prefect_at(address["prefect_api_url"])
    os.environ.setdefault("MLFLOW_TRACKING_URI", address["mlflow_tracking_uri"])
    return address


@contextlib.contextmanager
def _prefect_calls() -> Iterator[None]:
    """Prefect client calls that give up after REQUEST_TIMEOUT_S (Prefect's own default is 60 s,
    retried five times), their failures one ServiceError that names the API."""
    import httpx
    from prefect.exceptions import ObjectNotFound, PrefectException
    from prefect.settings import (
        PREFECT_API_REQUEST_TIMEOUT,
        PREFECT_CLIENT_MAX_RETRIES,
        temporary_settings,
    )

    url = os.environ.get("PREFECT_API_URL", "(PREFECT_API_URL unset)")
    try:
        with temporary_settings(updates={PREFECT_API_REQUEST_TIMEOUT: REQUEST_TIMEOUT_S,
                                         PREFECT_CLIENT_MAX_RETRIES: 1}):
            yield
    except ObjectNotFound as err:
        raise ServiceError(f"the Prefect API at {url} has no deployment {FLOW}/{DEPLOYMENT}: "
                           "start `quantgate serve` (it deploys the flow) or point PREFECT_API_URL "
                           "at the service's Prefect") from err
    except httpx.TimeoutException as err:
        raise ServiceError(f"the Prefect API at {url} did not answer within "
                           f"{REQUEST_TIMEOUT_S:g} s: check that server, then try again") from err
    except (httpx.HTTPError, PrefectException) as err:
        raise ServiceError(f"the Prefect API at {url} failed ({' '.join(str(err).split())}): "
                           "check that server (`quantgate serve` logs under its state folder), "
                           "then try again") from err


@contextlib.contextmanager
def _mlflow_calls(tracking_uri: str) -> Iterator[None]:
    """MLflow client calls bounded like _prefect_calls (MLflow's defaults: 120 s, 7 retries)."""
    import requests
    from mlflow.exceptions import MlflowException

    from flows.tracking import bounded_http

    try:
        with bounded_http(REQUEST_TIMEOUT_S):
            yield
    except (MlflowException, requests.RequestException) as err:
        reason = " ".join(str(err).split())[:300]
        raise ServiceError(f"the MLflow server at {tracking_uri} failed ({reason}): check that "
                           "server, then try again") from err


async def _prepare_server() -> int:
    """The pool and this host's limit, created where missing; returns the host slots it freed.

    The service starts before any of its workers: a slot the limit still counts as taken was
    left by an acceptance that died with an earlier service (killed past its grace period).
    Its lease lived in that Prefect server's memory and went with it, so nothing would ever
    give the slot back, and every run queued on this host would wait for ever."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import (
        GlobalConcurrencyLimitCreate,
        GlobalConcurrencyLimitUpdate,
        WorkPoolCreate,
    )
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

    async with get_client() as client:
        try:
            await client.read_work_pool(POOL)
        except ObjectNotFound:
            try:
                await client.create_work_pool(WorkPoolCreate(name=POOL, type="process"))
            except ObjectAlreadyExists:
                pass
        try:
            limit = await client.read_global_concurrency_limit_by_name(host_limit())
        except ObjectNotFound:
            try:
                await client.create_global_concurrency_limit(
                    GlobalConcurrencyLimitCreate(name=host_limit(), limit=1))
            except ObjectAlreadyExists:
                pass
            return 0
        if limit.active_slots:
            await client.update_global_concurrency_limit(
                host_limit(), GlobalConcurrencyLimitUpdate(active_slots=0))
        return limit.active_slots


def deploy(log=print) -> str:
    """The work pool, this host's limit, and the deployment `acceptance/quantgate`."""
    from prefect import flow

    freed = asyncio.run(_prepare_server())
    if freed:
        log(f"host limit {host_limit()}: {freed} slot(s) left taken by an acceptance that died "
            "with an earlier service, given back")
    remote = flow.from_source(source=str(REPO), entrypoint="flows/acceptance.py:acceptance")
    deployment_id = remote.deploy(name=DEPLOYMENT, work_pool_name=POOL, build=False, push=False,
                                  print_next_steps=False, ignore_warnings=True)
    return str(deployment_id)


def start_worker(state_dir: Path, name: str) -> subprocess.Popen:
    """A Prefect process worker on the pool, one flow run at a time."""
    prefect = Path(sys.executable).with_name("prefect")
    log = (state_dir / f"{name}.log").open("a")
    return subprocess.Popen(
        [str(prefect), "worker", "start", "--pool", POOL, "--type", "process", "--limit", "1",
         "--name", name],
        stdout=log, stderr=subprocess.STDOUT, env=os.environ | {"PYTHONPATH": str(REPO)},
        cwd=REPO, start_new_session=True)


# A Prefect 3 process worker forwards SIGTERM to itself as SIGINT and then took a minute to exit
# in the e2e service story (idle or not); once its flow runs are gone it has nothing left to do.
WORKER_GRACE_S = 10.0


def stop_process_trees(processes: list[subprocess.Popen], grace_s: float = 60,
                       worker_grace_s: float = WORKER_GRACE_S) -> None:
    """SIGTERM the flow runs under every worker at once (each stops its engines and is marked
    crashed), then the workers; SIGKILL whatever is left after the grace periods. One worker
    at a time, each waited out, took two minutes to stop two workers while the stage under the
    second one went on measuring."""
    import psutil

    from infra.process import stop_processes

    alive = [process for process in processes if process.poll() is None]
    children: list = []
    for process in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            children += psutil.Process(process.pid).children(recursive=True)
    stop_processes(children, grace_s)
    for process in alive:
        process.terminate()
    deadline = time.monotonic() + worker_grace_s
    for process in alive:
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def submit(spec_path: Path, key: str | None = None, no_cache: bool = False,
           registry_version: str | None = None) -> tuple[str, str]:
    """Queue an acceptance; (flow run id, what happened). The same key is the same run: a run
    with that key still queued or done is returned as is, a crashed one is queued again (its
    finished stages come back from the stage cache)."""
    from prefect.deployments import run_deployment

    parameters = {"spec_path": str(spec_path.resolve()), "no_cache": no_cache,
                  "registry_version": registry_version}
    with _prefect_calls():
        run = run_deployment(f"{FLOW}/{DEPLOYMENT}", parameters=parameters, timeout=0,
                             idempotency_key=key, as_subflow=False)
        state = run.state.type.value if run.state else "SCHEDULED"
        if state in RESUMABLE:
            asyncio.run(_reschedule(run.id))
            return str(run.id), f"resumed (was {state.lower()})"
    if key is not None and run.parameters != parameters:
        return str(run.id), f"already submitted as {key} ({state.lower()})"
    return str(run.id), state.lower()


async def _reschedule(flow_run_id) -> None:
    from prefect.client.orchestration import get_client
    from prefect.states import Scheduled

    async with get_client() as client:
        await client.set_flow_run_state(flow_run_id, Scheduled(), force=True)


async def _runs(limit: int):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterName
    from prefect.client.schemas.sorting import FlowRunSort

    async with get_client() as client:
        return await client.read_flow_runs(
            deployment_filter=DeploymentFilter(name=DeploymentFilterName(any_=[DEPLOYMENT])),
            sort=FlowRunSort.EXPECTED_START_TIME_DESC, limit=limit)


def status(tracking_uri: str, experiment: str, limit: int = 50) -> list[dict[str, str]]:
    """Queued, running and finished acceptances, newest first, with their MLflow verdicts."""
    import mlflow

    with _prefect_calls():
        runs = asyncio.run(_runs(limit))
    verdicts: dict[str, dict[str, str]] = {}
    with _mlflow_calls(tracking_uri):
        client = mlflow.MlflowClient(tracking_uri)
        found = client.get_experiment_by_name(experiment)
        if found is not None and runs:
            # MLflow filters tags by =, != and LIKE only: every service run, then matched here.
            # Newest first; a resumed run's crashed attempt has no verdict: the judged one wins.
            for logged in client.search_runs([found.experiment_id],
                                             "tags.`prefect.flow_run_id` LIKE '%'",
                                             max_results=1000):
                tags = logged.data.tags
                known = verdicts.get(tags["prefect.flow_run_id"])
                if known is None or ("verdict" in tags and "verdict" not in known):
                    verdicts[tags["prefect.flow_run_id"]] = tags
    rows = []
    for run in runs:
        tags = verdicts.get(str(run.id), {})
        rows.append({
            "id": str(run.id), "name": run.name, "state": run.state.name if run.state else "-",
            "candidate": tags.get("candidate", "-"),
            "registry": str(run.parameters.get("registry_version") or "-"),
            "verdict": tags.get("verdict", "-"),
            "spec": Path(str(run.parameters.get("spec_path", "-"))).name,
        })
    return rows


async def _crash_leftovers(pids: set[int]) -> int:
    """Runs still RUNNING in flow processes of our workers once those are gone cannot finish:
    mark them crashed. A run's process normally reports its own crash on SIGTERM, but it can die
    first (signalled with its engines, mid-call); the server does not notice a process that is
    gone, so a resubmit with the same key would find it RUNNING forever."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterState, FlowRunFilterStateType
    from prefect.client.schemas.objects import StateType
    from prefect.states import Crashed

    async with get_client() as client:
        running = await client.read_flow_runs(flow_run_filter=FlowRunFilter(
            state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.RUNNING]))))
        count = 0
        for run in running:
            if run.work_pool_name == POOL and flow_process_id(run.infrastructure_pid) in pids:
                await client.set_flow_run_state(
                    run.id, Crashed(message="quantgate serve stopped while this run was running; "
                                    "submit it again to resume"), force=True)
                count += 1
        return count


def flow_process_id(infrastructure_pid: str | None) -> int | None:
    """The process id a worker recorded for its run: Prefect 3.7's process worker writes the bare
    pid, earlier ones "<hostname>:<pid>" (a pid from another host is never ours)."""
    host, _, pid = str(infrastructure_pid or "").rpartition(":")
    if host and host != socket.gethostname():
        return None
    return int(pid) if pid.isdigit() else None


def flow_processes(workers: list[subprocess.Popen]) -> set[int]:
    """The pids of every process under our workers (their flow runs among them)."""
    import psutil

    pids: set[int] = set()
    for worker in workers:
        with contextlib.suppress(psutil.Error):
            pids.update(child.pid for child in psutil.Process(worker.pid).children(recursive=True))
    return pids


def crash_leftovers(pids: set[int]) -> int:
    return asyncio.run(_crash_leftovers(pids))


def intake(client, watched: list[str], seen: set[str], specs_dir: Path, log) -> list[str]:
    """Queue one acceptance per new model version of the watched registered models; the
    registry is the source of truth, `model@version` the key (a version is never run twice)."""
    from flows.preflight import Prepared
    from flows.registry import mark, materialize, poll

    queued = []
    for candidate in poll(client, watched, seen):
        try:
            spec = materialize(candidate, specs_dir)
            # A spec that cannot run is an error on the version, not a queued run.
            Prepared(spec, engine_host=False)
            run_id, what = submit(spec, key=candidate.key, registry_version=candidate.key)
        except ServiceError as err:
            # Prefect down or slow is not the version's fault: the next poll offers it again.
            seen.discard(candidate.key)
            log(f"{candidate.key}: not queued yet: {err}")
            continue
        except QuantgateError as err:
            mark(client, candidate, "error", error=str(err)[:4000])
            log(f"{candidate.key}: not queued: {err}")
            continue
        mark(client, candidate, "queued", flow_run_id=run_id)
        log(f"{candidate.key}: queued as flow run {run_id} ({what})")
        queued.append(run_id)
    return queued


def local_checkpoints(client, folder: Path) -> None:
    """Checkpoints registered through a server on this host go into a local folder, where they
    are hard-linked (a proxied artifact store would take a copy of every checkpoint)."""
    from flows.registry import CHECKPOINT_EXPERIMENT

    if client.get_experiment_by_name(CHECKPOINT_EXPERIMENT) is None:
        client.create_experiment(CHECKPOINT_EXPERIMENT, artifact_location=folder.as_uri())


def webhook_env(state_dir: Path) -> None:
    """What an MLflow server started here needs to deliver webhooks to a receiver on this box:
    plain http to a private address, and one secret-encryption key that survives restarts
    (without it MLflow draws a new key per process and cannot read the stored secrets back)."""
    from cryptography.fernet import Fernet

    key_file = state_dir / "webhook-encryption.key"
    if not key_file.exists():
        key_file.write_bytes(Fernet.generate_key())
        key_file.chmod(0o600)
    os.environ.setdefault("MLFLOW_WEBHOOK_SECRET_ENCRYPTION_KEY", key_file.read_text().strip())
    os.environ.setdefault("MLFLOW_WEBHOOK_ALLOWED_SCHEMES", "http,https")
    os.environ.setdefault("MLFLOW_WEBHOOK_ALLOW_PRIVATE_IPS", "true")


def _joined(name: str, url: str, setting: str) -> None:
    """Refuse a server to join that is not an http(s) URL or does not answer its health check."""
    fix = f"start it, or leave {setting.split()[0]} out to start one here"
    if not _is_http_url(url):
        raise ServiceError(f"{setting} {url!r} is not an http(s) URL of the {name}: {fix}")
    _probe(name, url, "/health", f"from {setting}", fix)


def run_service(state_dir: Path, prefect_api_url: str | None, mlflow_uri: str | None,
                workers: int, watch: list[str], poll_s: float, webhook_port: int | None,
                webhook_secret: str | None, log) -> None:
    """Serve until SIGTERM / Ctrl-C (raised as SystemExit / KeyboardInterrupt by the caller)."""
    import queue
    import threading

    import mlflow

    from infra.servers import MlflowServer, PrefectServer

    # Servers to join must answer first: Prefect's and MLflow's clients retry one that does not
    # for minutes, after this service has started its own servers and workers.
    if prefect_api_url is not None:
        _joined("Prefect API", prefect_api_url, "--prefect-api-url (or PREFECT_API_URL)")
    if mlflow_uri is not None and mlflow_uri.startswith(("http://", "https://")):
        _joined("MLflow server", mlflow_uri, "--mlflow-uri (or MLFLOW_TRACKING_URI)")
    state_dir = state_dir.resolve()
    state_dir.mkdir(parents=True, exist_ok=True)
    webhook_env(state_dir)
    with contextlib.ExitStack() as stack:
        if prefect_api_url is None:
            prefect_api_url = stack.enter_context(PrefectServer(state_dir / "prefect")).api_url
        point_prefect_at(prefect_api_url)
        local_mlflow = mlflow_uri is None or not mlflow_uri.startswith(("http://", "https://"))
        if local_mlflow:
            backend = mlflow_uri or f"sqlite:///{state_dir / 'mlflow.db'}"
            mlflow_uri = stack.enter_context(
                MlflowServer(backend, state_dir / "mlartifacts")).tracking_uri
        os.environ["MLFLOW_TRACKING_URI"] = mlflow_uri
        if local_mlflow:
            local_checkpoints(mlflow.MlflowClient(mlflow_uri), state_dir / "checkpoints")
        log(f"prefect: {prefect_api_url}  mlflow: {mlflow_uri}")
        deploy(log)
        address = write_address(state_dir, prefect_api_url, mlflow_uri)
        stack.callback(address.unlink, missing_ok=True)
        names = [f"{socket.gethostname()}-{os.getpid()}-{n}" for n in range(workers)]
        processes = [start_worker(state_dir, name) for name in names]

        def stop_workers() -> None:
            flows_under_workers = flow_processes(processes)  # before they are gone
            stop_process_trees(processes)
            crashed = crash_leftovers(flows_under_workers)
            if crashed:
                log(f"{crashed} running acceptance(s) marked crashed; submit again to resume")

        stack.callback(stop_workers)
        log(f"deployment {FLOW}/{DEPLOYMENT} on pool {POOL}: {workers} worker(s), host limit "
            f"{host_limit()} = 1")
        client = mlflow.MlflowClient(mlflow_uri)
        wakeups: queue.Queue[str] = queue.Queue()
        if webhook_port is not None:
            from flows.webhook import make_app, serve_webhook

            if not webhook_secret:
                raise ServiceError("a webhook needs a secret: set QG_WEBHOOK_SECRET")
            app = make_app(webhook_secret, lambda model, version: wakeups.put(f"{model}@{version}"))
            receiver = serve_webhook(app, "127.0.0.1", webhook_port)
            stack.callback(receiver.stop)
            log(f"webhook receiver: http://127.0.0.1:{webhook_port}/webhook")
        seen: set[str] = set()
        stop = threading.Event()
        while not stop.is_set():
            dead = [n for n, p in zip(names, processes, strict=True) if p.poll() is not None]
            if dead:
                raise ServiceError(f"worker {dead[0]} exited (log {state_dir / dead[0]}.log)")
            if watch:
                intake(client, watch, seen, state_dir / "specs", log)
            with contextlib.suppress(queue.Empty):
                key = wakeups.get(timeout=poll_s)
                log(f"webhook: {key} created; polling the registry now")
