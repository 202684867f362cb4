"""Checking a spec and running its acceptance here: `validate`, `run`."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from flows.commands.shared import console, fail, print_verdict
from infra.errors import QuantgateError
from infra.quiet import QUIET_ENV

app = typer.Typer()


@app.command()
def validate(spec: Path) -> None:
    """Check a spec, its stages' axes, eval sets, load profile and gate policy; run nothing."""
    from flows.preflight import Prepared
    from flows.settings import check_writable, load_settings
    from infra.ports import port_free

    try:
        prepared = Prepared(spec)
        engine = prepared.spec.engine
        if engine.starts_server and engine.port is not None and not port_free(engine.host,
                                                                               engine.port):
            fail(f"engine.port {engine.port} on {engine.host} is already in use: stop what holds "
                 "it, choose another engine.port, or leave engine.port unset (a free port per "
                 "engine)")
        check_writable(load_settings())
    except QuantgateError as err:
        fail(str(err))
    table = Table(title=escape(f"{prepared.spec.candidate}: valid"))
    for column in ("stage", "kind", "parent", "weights", "activations", "kv_cache", "checkpoint"):
        table.add_column(column, overflow="fold")
    for stage in prepared.stages:  # a checkpoint's folder is named as its owner liked: "[/]"
        table.add_row(*(escape(str(cell)) for cell in (
            stage.name, stage.kind, stage.parent, stage.axes.weights, stage.axes.activations,
            stage.axes.kv_cache, stage.checkpoint.name)))
    console.print(table)
    from evalsets.lmeval_task import check_data

    for evalset in prepared.spec.evalsets:  # where each named lm-eval task's data were found
        if evalset.lm_eval is not None:
            console.print(escape(check_data(evalset).line(evalset.name)), highlight=False)
    for plan in prepared.power:
        console.print(f"accuracy gate, {escape(plan.describe(prepared.policy.quality.power))}")
    for whole in prepared.decision_power:
        console.print(f"power, {escape(whole.describe(prepared.policy.quality.power))}")
    for line in prepared.placement.describe() if prepared.placement else ():
        console.print(f"placement: {escape(line)}")


@app.command()
def run(
    spec: Path,
    no_cache: Annotated[bool, typer.Option(
        "--no-cache", help="Measure every stage again instead of reusing stored stages.")] = False,
) -> None:
    """Run the acceptance flow for one candidate; exit 0 go, 1 rollback, 2 invalid input."""
    os.environ.update({k: v for k, v in QUIET_ENV.items() if k not in os.environ})
    from flows.interrupt import install, kept_line, restore

    started, settings = time.time(), None
    # Before the flow's imports (Prefect, MLflow, lm-eval: seconds): a signal while they load
    # ends the run as one later does, 130 and its one line.
    install(lambda: kept_line(spec, settings, started, no_cache))
    try:
        from flows.acceptance import acceptance
        from flows.preflight import checked
        from flows.settings import check_writable, load_settings

        checked(spec)  # fail fast, before Prefect and any engine start
        settings = load_settings()
        check_writable(settings)  # not an hour in, after the engines measured
        verdict = acceptance(str(spec), no_cache=no_cache)
    except QuantgateError as err:
        fail(str(err))
    finally:
        restore()
    print_verdict(verdict)
    raise typer.Exit(verdict.exit_code)
