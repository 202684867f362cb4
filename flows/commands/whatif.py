"""The capacity what-if on target GPUs: `whatif` (a prediction, never a measurement)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.table import Table

from flows.commands.shared import console, fail
from infra.errors import QuantgateError

if TYPE_CHECKING:
    import pandas as pd

app = typer.Typer()


def _whatif_inputs(source: Path, profile: str | None):
    """(stages as (name, emulated, config.json dict, axes), the load profile and where it came
    from (the one named, else the spec's or the run's), lines on stages left out)."""
    from gates.whatif.records import run_profile, served_axes, spec_profile, stage_shape
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
                stages.append((record.name, record.emulated, found.config, served_axes(record)))
        if profile is None:
            return stages, *run_profile(source), skipped
    elif source.is_file():
        from flows.axes import weight_mix
        from flows.plan import plan
        from flows.spec import load_spec
        from infra.checkpoint import read_config

        spec = load_spec(source)
        stages = []
        for stage in plan(spec):
            config = read_config(stage.checkpoint)
            mix = weight_mix(config)
            stages.append((stage.name, stage.axes.emulated, config,
                           stage.axes.model_dump() | ({"weight_mix": mix} if mix else {})))
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


def _predict(job: tuple) -> pd.DataFrame:
    """One stage on one GPU (a worker process's unit of work)."""
    from gates.whatif import whatif_table

    config, stage, target, workload, settings, rate = job
    return whatif_table(config, stage, [target], workload, settings=settings, rate=rate)


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

    from gates.whatif.hardware import load_devices
    from gates.whatif.search import SimSettings
    from gates.whatif.section import DEFAULT_GPUS, REPORT_SETTINGS, describe_workload, rate_text
    from infra.spread import spread
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
        # Stages that serve alike are predicted once; each (stage, GPU) on a core of its own.
        keys = {name: json.dumps([config, axes], sort_keys=True, default=str)
                for name, _, config, axes in stages}
        jobs = {(keys[name], target): (config, {name: axes}, target, workload, settings, rate)
                for name, _, config, axes in stages for target in gpus}
        rows = dict(zip(jobs, spread(_predict, list(jobs.values())), strict=True))
        tables = [pd.concat([rows[keys[name], target] for target in gpus], ignore_index=True)
                  .assign(stage=name, emulated=emulated) for name, emulated, _, _ in stages]
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
