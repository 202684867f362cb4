"""quantgate as a service and its registry: `serve`, `submit`, `status`, `register`, `promote`,
`rollback`, and `load-ui` for a live look at a running stage."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from flows.commands.shared import console, fail
from infra.errors import QuantgateError
from infra.quiet import QUIET_ENV

app = typer.Typer()


@app.command()
def serve(
    prefect_api_url: Annotated[str | None, typer.Option(
        envvar="PREFECT_API_URL", help="A Prefect API to join; default: start a local server.")] = None,
    mlflow_uri: Annotated[str | None, typer.Option(
        envvar="MLFLOW_TRACKING_URI", help="An MLflow server (http) to join, or the backend "
        "store of the one to start (sqlite, postgresql); default: sqlite in the state folder.")] = None,
    workers: Annotated[int, typer.Option(min=1, help="Process workers on this host.")] = 1,
    watch: Annotated[list[str] | None, typer.Option(
        help="A registered model whose new versions are candidates (repeatable).")] = None,
    poll_s: Annotated[float, typer.Option(help="Registry poll interval in seconds.")] = 10,
    webhook_port: Annotated[int | None, typer.Option(
        help="Also receive MLflow's model_version.created webhook on this port.")] = None,
    webhook_secret: Annotated[str | None, typer.Option(
        envvar="QG_WEBHOOK_SECRET", help="The webhook's HMAC secret.")] = None,
) -> None:
    """Run quantgate as a service until stopped: Prefect deployment, workers, registry intake."""
    os.environ.update({k: v for k, v in QUIET_ENV.items() if k not in os.environ})
    from flows.service import run_service
    from flows.settings import load_settings

    try:
        settings = load_settings()
    except QuantgateError as err:
        fail(str(err))
    # Workers run elsewhere (the repo root): hand them absolute folders.
    os.environ["QG_RESULTS_DIR"] = str(settings.results_dir.resolve())
    os.environ["QG_REPORTS_DIR"] = str(settings.reports_dir.resolve())
    os.environ["QG_CACHE_DIR"] = str(settings.stage_cache_dir)
    try:
        run_service(settings.state_dir, prefect_api_url, mlflow_uri, workers, watch or [], poll_s,
                    webhook_port, webhook_secret,
                    lambda line: console.print(escape(line), highlight=False, soft_wrap=True))
    except QuantgateError as err:
        fail(str(err))


@app.command()
def submit(
    spec: Path,
    key: Annotated[str | None, typer.Option(
        help="Idempotency key: the same key is the same run (a crashed one resumes).")] = None,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Measure every stage again.")] = False,
) -> None:
    """Queue an acceptance on the running service; prints the flow run id."""
    from flows.preflight import Prepared
    from flows.service import submit as queue_run
    from flows.service import use_service
    from flows.settings import load_settings

    try:
        use_service(load_settings().state_dir, probe=True)  # a stopped service: one line, no wait
        Prepared(spec, engine_host=False)  # refuse a bad spec here, not in a worker an hour later
        run_id, what = queue_run(spec, key=key, no_cache=no_cache)
    except QuantgateError as err:
        fail(str(err))
    console.print(escape(f"{run_id} {what}"), highlight=False)  # `what` quotes the --key


@app.command()
def status(limit: Annotated[int, typer.Option(min=1, help="How many runs, newest first.")] = 50,
           ) -> None:
    """Queued, running and finished acceptances on the service, with their verdicts."""
    from flows.service import status as list_runs
    from flows.service import use_service
    from flows.settings import load_settings
    from flows.tracking import check_store

    try:
        settings = load_settings()
        address = use_service(settings.state_dir, probe=True)
        check_store(address["mlflow_tracking_uri"])  # a local store from the environment
        rows = list_runs(address["mlflow_tracking_uri"], settings.mlflow_experiment, limit)
    except QuantgateError as err:
        fail(str(err))
    table = Table(title="acceptances")
    for column in ("id", "name", "state", "candidate", "registry", "verdict", "spec"):
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*(escape(row[c]) for c in ("id", "name", "state", "candidate", "registry",
                                                  "verdict", "spec")))
    console.print(table)


def _registry_client(create: bool = False):
    """The running service's registry, else the one the settings name; a store that is not there
    is refused, not created, unless `create` (a command that writes to it)."""
    from flows.service import ServiceError, use_service
    from flows.settings import load_settings
    from flows.tracking import open_client

    with contextlib.suppress(ServiceError):
        use_service(load_settings().state_dir)
    return open_client(load_settings().mlflow_tracking_uri, create)  # use_service may set the URI


@app.command()
def register(
    model: str,
    checkpoint: Path,
    spec: Annotated[Path | None, typer.Option(
        help="The spec template this version is judged by (its last stage takes the "
        "checkpoint); default: the registered model's `quantgate.spec` tag.")] = None,
    stage: Annotated[str | None, typer.Option(help="The template stage the checkpoint fills.")] = None,
) -> None:
    """Register a checkpoint as a new version of MODEL: the watching service queues it."""
    from flows.registry import register_checkpoint, registration_tags
    from flows.tracking import bounded_http

    try:
        # What is refused is refused before a store is opened (created).
        tags = registration_tags(model, checkpoint, spec, stage)
        with bounded_http():
            version = register_checkpoint(_registry_client(create=True), model, checkpoint,
                                          tags=tags or None)
    except QuantgateError as err:
        fail(str(err))
    console.print(escape(f"{model} version {version.version}: {version.source}"), highlight=False)


@app.command()
def promote(model: str, version: str) -> None:
    """Make a model version the `champion` by hand (the old champion becomes `previous`)."""
    from flows.registry import check_model_name
    from flows.registry import promote as move
    from flows.tracking import bounded_http

    try:
        check_model_name(model)
        with bounded_http():
            console.print(escape(move(_registry_client(), model, version)), highlight=False)
    except QuantgateError as err:
        fail(str(err))


@app.command()
def rollback(model: str) -> None:
    """Give `champion` back to the `previous` version: the A/B switch in one move."""
    from flows.registry import check_model_name
    from flows.registry import rollback as move_back
    from flows.tracking import bounded_http

    try:
        check_model_name(model)
        with bounded_http():
            console.print(escape(move_back(_registry_client(), model)), highlight=False)
    except QuantgateError as err:
        fail(str(err))


@app.command("load-ui")
def load_ui(
    base_url: Annotated[str, typer.Option(help="A running stage's OpenAI-compatible root.")],
    model: Annotated[str, typer.Option(help="Served model name.")],
    profile: Annotated[str, typer.Option(help="Load profile name or path.")] = "demo",
) -> None:
    """Open Locust's web UI against a running stage for a live look (Ctrl-C to stop)."""
    from infra.external_engine import check_running
    from load.webui import open_webui

    try:
        check_running(base_url, model)  # Locust would wait forever on a URL nothing answers
        open_webui(base_url, model, profile=profile)
    except QuantgateError as err:
        fail(str(err))
