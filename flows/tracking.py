"""MLflow logging: a parent run per candidate, a nested run per stage, stable metric names."""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from gates.record import StageRecord
from gates.verdict import Verdict
from infra.errors import QuantgateError
from infra.secrets import redact

if TYPE_CHECKING:
    from mlflow import MlflowClient

LOAD_FIGURES = (
    "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p90_ms", "tpot_p99_ms",
    "itl_p50_ms", "itl_p90_ms", "itl_p99_ms", "e2e_p50_ms", "e2e_p90_ms", "e2e_p99_ms",
    "requests_per_s", "output_tokens_per_s", "error_rate", "goodput", "goodput_requests_per_s",
)


def stage_params(record: StageRecord) -> dict[str, str]:
    params = {f"axis.{axis}": value for axis, value in record.axes.items()}
    params |= {"stage_kind": record.kind, "parent": str(record.parent), "changed": ",".join(
        record.changed) or "-"}
    if record.facts:
        params |= {
            "engine.command": record.facts.command_line()[:6000],
            "engine.version": str(record.facts.version),
            "engine.kv_cache_dtype": str(record.facts.kv_cache_dtype),
        }
    return params


def timing_metrics(record: StageRecord) -> dict[str, float]:
    """time.*: where the stage's wall time went (seconds), engine-busy and overhead shares."""
    timings = record.timings
    if timings is None:
        return {}
    metrics = {"time.wall_s": timings.wall_s, "time.busy_s": round(timings.busy_s, 2),
               "time.overhead_s": round(timings.overhead_s, 2)}
    if timings.wall_s > 0:
        metrics["time.busy_share"] = round(timings.busy_s / timings.wall_s, 4)
    for name in ("startup_s", "scoring_s", "more_items_s", "load_s", "capacity_s"):
        if getattr(timings, name) is not None:
            metrics[f"time.{name}"] = float(getattr(timings, name))
    for name, timing in timings.sets.items():
        if timing.seconds is not None:
            metrics[f"time.quality.{name}_s"] = timing.seconds
    for level, seconds in timings.load_levels_s.items():
        metrics[f"time.load.{level}_s"] = seconds
    return metrics


def stage_metrics(record: StageRecord) -> dict[str, float]:
    metrics: dict[str, float] = timing_metrics(record)
    facts = record.facts
    if facts:
        for name in ("kv_cache_tokens", "weight_bytes", "startup_s", "max_model_len"):
            value = getattr(facts, name)
            if value is not None:
                metrics[f"engine.{name}"] = float(value)
    if record.quality:
        if record.quality.divergence:
            metrics["quality.divergence.mean_kl"] = record.quality.divergence.mean_kl
            metrics["quality.divergence.top1_agreement"] = record.quality.divergence.top1_agreement
        for name, task in record.quality.tasks.items():
            metrics[f"quality.{name}.{task.metric}"] = task.value
            lengths = [i.output_tokens for i in task.items if i.output_tokens is not None]
            if lengths:
                metrics[f"length.{name}.mean_output_tokens"] = sum(lengths) / len(lengths)
        if record.quality.perplexity is not None:
            metrics["quality.perplexity"] = record.quality.perplexity
        for against in ("parent", "baseline"):
            paired = getattr(record.quality, f"perplexity_vs_{against}")
            if paired is not None:
                metrics[f"quality.perplexity_ratio.{against}"] = paired.ratio
    if record.load:
        if record.load.capacity_rps is not None:
            metrics["load.capacity_rps"] = record.load.capacity_rps
        for level, summary in record.load.summaries.items():
            for name in LOAD_FIGURES:
                value = getattr(summary, name)
                if value is not None:
                    metrics[f"load.{level}.{name}"] = float(value)
    return metrics


class StoreError(QuantgateError):
    """An MLflow store that is not there, or that MLflow cannot open."""


VARIABLE = "MLFLOW_TRACKING_URI"
SETTING = f"{VARIABLE} (or QG_MLFLOW_TRACKING_URI)"


PROBE_TIMEOUT_S = 5.0  # a live server or database answers at once
HTTP_TIMEOUT_S = 20.0  # each MLflow HTTP call of a command that reads (MLflow's own: 120 s)
HTTP_RETRIES = 1  # MLflow's own: 7, with a back-off that waits minutes
DATABASE_PORTS = {"postgresql": 5432, "mysql": 3306, "mssql": 1433}


def scheme(uri: str) -> str:
    """A URI's scheme, lower case; '' for a plain path. Read without parsing the rest, which
    may be malformed (`http://[::1`): what is wrong with it is the probe's to say."""
    head, colon, _ = uri.partition(":")
    return head.lower() if colon and re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]*", head) else ""


def check_store(uri: str, create: bool = False) -> None:
    """Refuse, writing nothing, a store that is not there: MLflow creates a missing sqlite file
    and its tables just by opening it, and retries a server that does not answer for minutes.
    `create`: a missing sqlite file is made (by a command that writes), in a folder that exists."""
    shown = f"{VARIABLE}={redact(uri)}"
    if scheme(uri) == "sqlite":
        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import ArgumentError

        try:
            database = make_url(uri).database
        except (ArgumentError, ValueError) as err:
            raise StoreError(f"{shown}: not a sqlite URI ({err}); set {SETTING} to "
                             "sqlite:///<path to mlflow.db>") from err
        if not database or database == ":memory:":
            return
        path = Path(database).resolve()
        if path.exists():
            problem = _not_a_store(path, create)
            if problem:
                raise StoreError(f"{shown}: {problem}; set {SETTING} to the MLflow store "
                                 "(sqlite:///<path to mlflow.db>)")
            return
        if not create:
            raise StoreError(f"{shown}: no MLflow store there ({Path(database).resolve()} does "
                             f"not exist): nothing to read or change; set {SETTING} to the store "
                             "that holds it, or start `quantgate serve`")
        if not Path(database).resolve().parent.is_dir():
            raise StoreError(f"{shown}: no folder {Path(database).resolve().parent} for the "
                             f"store; create it or set {SETTING} to another store")
        return
    problem = unreachable(uri)
    if problem:
        raise StoreError(f"{shown}: {problem}, or set {SETTING} to another store")


def _not_a_store(path: Path, create: bool) -> str | None:
    """Why the sqlite file at `path` is no MLflow store, read without writing to it (MLflow
    fills an empty file or another program's database with its tables just by opening it);
    `create`: an empty file may become one."""
    import sqlite3

    if not path.is_file():
        return f"{path} is not a file"
    if create and path.stat().st_size == 0:
        return None
    try:
        with contextlib.closing(sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)) as db:
            tables = {row[0] for row in db.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.Error as err:
        return f"{path} is not an SQLite database ({err})"
    if "experiments" not in tables:
        return (f"{path} holds no MLflow store (no experiments table), and opening it would write "
                "MLflow's tables into it")
    return None


def unreachable(uri: str) -> str | None:
    """Why an MLflow server or database store does not answer, each probe bounded by
    PROBE_TIMEOUT_S (found without writing to it); None for one that answers, or a local store."""
    kind = scheme(uri)
    if kind in ("http", "https"):
        import httpx

        try:
            urlsplit(uri).port  # noqa: B018 - raises for a malformed host or port
        except ValueError as err:
            return f"not a URL ({err}): correct it"
        try:
            httpx.get(f"{uri.rstrip('/')}/health", timeout=PROBE_TIMEOUT_S).raise_for_status()
        except httpx.TimeoutException:
            return f"the MLflow server does not answer within {PROBE_TIMEOUT_S:g} s: start it"
        except (httpx.HTTPError, httpx.InvalidURL) as err:
            return f"the MLflow server does not answer ({type(err).__name__}): start it"
    elif kind.split("+")[0] in DATABASE_PORTS:
        return _unreachable_database(uri)
    return None


def _unreachable_database(uri: str) -> str | None:
    """A database store: its driver loads, its host accepts a connection, and it answers a login
    (postgresql, mysql), each within PROBE_TIMEOUT_S: the drivers' own connect waits unbounded."""
    import importlib.util
    import socket

    from sqlalchemy import create_engine
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError
    from sqlalchemy.pool import NullPool

    try:
        url = make_url(uri)
        url.get_dialect().import_dbapi()
    except (ImportError, NoSuchModuleError) as err:  # NoSuchModuleError is an ArgumentError
        other = (" (or name psycopg2, which is: postgresql+psycopg2://…)"
                 if url.drivername == "postgresql" and importlib.util.find_spec("psycopg2") else "")
        return f"its database driver cannot be loaded ({redact(str(err))}): install it{other}"
    except (ArgumentError, ValueError) as err:
        return f"not a database URI ({redact(str(err))}): correct it"
    backend = url.get_backend_name()
    host, port = url.host, url.port or DATABASE_PORTS[backend]
    if host is None:  # a local socket: the driver's business
        return None
    try:
        socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S).close()
    except OSError as err:
        return (f"nothing answers at {host}:{port} ({err.strerror or type(err).__name__}): start "
                "the database")
    if backend not in ("postgresql", "mysql"):
        return None
    # libpq counts connect_timeout in whole seconds, at least 2.
    engine = create_engine(url, poolclass=NullPool,
                           connect_args={"connect_timeout": max(2, round(PROBE_TIMEOUT_S))})
    try:
        with engine.connect():
            return None
    except DBAPIError as err:
        reason = " ".join(str(err.orig).split())[:300]
        return (f"the database at {host}:{port} does not let MLflow in ({redact(reason)}): check "
                "its address, user and password")
    finally:
        engine.dispose()


@contextlib.contextmanager
def bounded_http(timeout_s: float | None = None) -> Iterator[None]:
    """MLflow HTTP calls in this block give up after `timeout_s` (default HTTP_TIMEOUT_S) and
    HTTP_RETRIES retries (the user's own MLFLOW_HTTP_REQUEST_* settings win); the bounds end
    with the block."""
    timeout_s = HTTP_TIMEOUT_S if timeout_s is None else timeout_s
    bounds = {"MLFLOW_HTTP_REQUEST_TIMEOUT": str(max(1, round(timeout_s))),
              "MLFLOW_HTTP_REQUEST_MAX_RETRIES": str(HTTP_RETRIES)}
    added = [name for name in bounds if name not in os.environ]
    os.environ.update({name: bounds[name] for name in added})
    try:
        yield
    finally:
        for name in added:
            os.environ.pop(name, None)


def mlflow_message(err: Exception) -> str:
    """An MlflowException's message on one line (MLflow's span several, with links)."""
    return " ".join(str(getattr(err, "message", err)).split()).rstrip(".")


def open_client(uri: str, create: bool = False) -> MlflowClient:
    """An MlflowClient on a store that is there (`create`: or a new sqlite file), or StoreError
    in one line; opening a sqlite store is what creates it, so the check comes first."""
    check_store(uri, create)
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    try:
        return MlflowClient(uri)
    except MlflowException as err:  # a file store, an unknown scheme: MLflow refuses it
        raise StoreError(f"{VARIABLE}={redact(uri)}: MLflow cannot open it "
                         f"({redact(mlflow_message(err))}); set {SETTING} to a database "
                         "(sqlite:///mlflow.db) or an MLflow server") from err


def redacted(params: dict[str, str]) -> dict[str, str]:
    return {name: redact(str(value)) for name, value in params.items()}


class Tracker:
    """Owns the MLflow runs of one acceptance; marks them FAILED if the flow breaks."""

    def __init__(self, tracking_uri: str, experiment: str) -> None:
        import mlflow

        self.mlflow = mlflow
        mlflow.set_tracking_uri(tracking_uri)
        mlflow.set_experiment(experiment)
        self.parent_run_id: str | None = None

    @contextlib.contextmanager
    def candidate_run(self, candidate: str, params: dict[str, str],
                      tags: dict[str, str] | None = None) -> Iterator[str]:
        with self._run(run_name=candidate, tags={"candidate": candidate} | (tags or {})) as run_id:
            self.parent_run_id = run_id
            self.mlflow.log_params(redacted(params))
            yield run_id

    @contextlib.contextmanager
    def stage_run(self, candidate: str, stage: str, kind: str) -> Iterator[str]:
        """A stage's nested run, open while the stage is measured: its duration and status are
        the stage's own (FAILED when the measuring breaks)."""
        tags = {"candidate": candidate, "stage": stage, "stage_kind": kind}
        with self._run(run_name=f"{candidate}/{stage}", nested=True, tags=tags) as run_id:
            yield run_id

    @contextlib.contextmanager
    def _run(self, **start: object) -> Iterator[str]:
        """An MLflow run, FINISHED when the block ends, FAILED (with why) when it raises."""
        run = self.mlflow.start_run(**start)
        try:
            yield run.info.run_id
        except BaseException as err:
            self.mlflow.set_tag("failure", redact(f"{type(err).__name__}: {err}")[:5000])
            self.mlflow.end_run(status="FAILED")
            raise
        self.mlflow.end_run(status="FINISHED")

    def log_stage(self, record: StageRecord, folder: Path, cached: bool = False) -> None:
        """Into the open stage run: params, metrics, the results folder."""
        self.mlflow.set_tag("cached", str(cached).lower())
        self.mlflow.log_params(redacted(stage_params(record)))
        self.mlflow.log_metrics(stage_metrics(record))
        if record.error:
            self.mlflow.set_tag("failure", redact(record.error)[:5000])
        if folder.is_dir():
            self.mlflow.log_artifacts(str(folder), artifact_path="results")
            if record.error:
                self.mlflow.end_run(status="FAILED")

    def log_verdict(self, verdict: Verdict, verdict_path: Path, report_dir: Path) -> None:
        from gates.compare import run_metrics, run_tags

        # The same tags and gate.* metrics on every candidate's parent run, so the MLflow UI's
        # compare view shows what `quantgate compare` prints.
        self.mlflow.set_tags(run_tags(verdict))
        self.mlflow.log_metrics(run_metrics(verdict))
        self.mlflow.log_artifact(str(verdict_path))
        self.mlflow.log_artifacts(str(report_dir), artifact_path="report")
        client = self.mlflow.tracking.MlflowClient()
        for stage in verdict.stages:
            runs = client.search_runs(
                [self.mlflow.active_run().info.experiment_id],
                filter_string=f"tags.mlflow.parentRunId = '{self.parent_run_id}' "
                f"and tags.stage = '{stage.stage}'",
            )
            for run in runs:
                client.set_tag(run.info.run_id, "verdict", "pass" if stage.passed else "fail")
