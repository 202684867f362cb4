"""Reading stored runs: `gate` (the verdict again, and the report), `compare`, `formats`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from flows.commands.shared import console, fail, print_verdict
from infra.errors import QuantgateError

app = typer.Typer()


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
    from gates.decide import decide, load_records, repair_verdicts
    from gates.diagnosis import read_diagnoses
    from gates.policy import load_policy, run_policy
    from gates.rules import check_settings

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
        check_settings(rules, f"gate policy {source}")  # plug-in rules' own settings
        console.print(f"policy: {escape(source)}", highlight=False)
        verdict = decide(candidate, records, rules)
        verdict.repairs = repair_verdicts(candidate, records, rules, read_diagnoses(
            results_dir, [r.name for r in records]))
    except QuantgateError as err:
        fail(str(err))
    print_verdict(verdict)
    placement = _run_placement(results_dir)
    for line in placement.describe() if placement else []:  # where a CUDA run's engines went
        console.print(f"placement: {escape(line)}", highlight=False)
    if report is not None:
        from gates.report import write_report

        try:
            from gates.whatif.records import run_workload

            try:  # the check of the what-if against this run's measurement needs its profile
                workload, origin = run_workload(results_dir)
            except QuantgateError:
                workload, origin = None, ""
            written = write_report(verdict, records, report, signer, run=results_dir.resolve().name,
                                   workload=workload, workload_source=origin,
                                   placement=placement,
                                   prompts=_run_prompts(results_dir),
                                   diagnoses=read_diagnoses(results_dir, [r.name for r in records]))
        except OSError as err:
            fail(f"cannot write the report into {report}: {err.strerror or err}; choose a "
                 "writable folder")
        console.print(f"report: {escape(str(written['html']))}", highlight=False)
    raise typer.Exit(verdict.exit_code)


def _run_prompts(results_dir: Path):
    """The prompts the run kept in its folder (gates.run_inputs), for the flips the report shows;
    for a run from before inputs were kept, None: the sets' data, its spec read again."""
    from gates.run_inputs import RunInputs, stored_prompts

    try:
        kept = RunInputs.kept(results_dir)
    except QuantgateError as err:
        fail(str(err))
    if kept is None:
        return _spec_prompts(results_dir)
    return lambda set_name: stored_prompts(results_dir, set_name)


def _spec_prompts(results_dir: Path):
    """For a run from before inputs were kept: its spec read again where it still is, so that
    the flips of its user eval sets show the user's prompts; without it they show hashes."""
    from flows.spec import load_spec
    from gates.record import RunManifest
    from gates.report import set_prompts

    try:
        spec_path = RunManifest.read(results_dir).spec_path
        sets = load_spec(Path(spec_path)).evalsets if spec_path else []
    except (QuantgateError, OSError):
        sets = []  # a spec moved or changed since: the report still has every number
    return set_prompts({evalset.name: evalset.info for evalset in sets})


def _run_placement(results_dir: Path):
    """Where the run's CUDA engines went, as its manifest recorded it (None off CUDA or unread)."""
    from gates.record import RunManifest
    from infra.placement import Placement

    try:
        stored = RunManifest.read(results_dir).placement
        return Placement.model_validate(stored) if stored else None
    except (QuantgateError, ValueError):  # an older or damaged manifest: the report says nothing
        return None


@app.command()
def compare(
    candidates: Annotated[list[str] | None, typer.Argument(help="Candidate names; default: all.")] = None,
    experiment: Annotated[str | None, typer.Option(help="MLflow experiment; default: settings'.")] = None,
) -> None:
    """Print candidates side by side from their MLflow runs (what the MLflow compare view shows)."""
    from flows.settings import load_settings
    from flows.tracking import bounded_http, check_store
    from gates.compare import compare as compare_runs

    try:
        settings = load_settings()
        check_store(settings.mlflow_tracking_uri)  # MLflow would create a missing sqlite store
        with bounded_http():  # a server that stops answering after its health check
            table_data = compare_runs(settings.mlflow_tracking_uri,
                                      experiment or settings.mlflow_experiment, candidates or None)
    except QuantgateError as err:
        fail(str(err))
    table = Table(title="candidates")
    table.add_column("", overflow="fold")
    for column in table_data.columns:  # candidate names and tags are whatever runs logged
        table.add_column(escape(str(column)), overflow="fold")
    for name, row in table_data.iterrows():
        table.add_row(escape(str(name)),
                      *("-" if v is None or v != v else escape(str(v)) for v in row))
    console.print(table)


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
