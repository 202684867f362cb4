"""The sign-off report's "Capacity what-if (prediction)" section, from stage records alone.

Two parts. On target GPUs: each stage's predicted low-load TTFT / TPOT and SLO capacity, an
emulated stage in its real format (its axes), never its bf16 twin. On what served the stages
(the GPU of a CUDA run's placement, else this machine's CPU): the roofline's two efficiency knobs
fitted to the baseline stage as measured, then every really-served stage predicted and put beside
its measurement, so a reader sees how far the model can be trusted.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gates.record import StageRecord
from gates.whatif import predict_stage
from gates.whatif.calibrate import Baseline, calibrate
from gates.whatif.cpu import cpu_device
from gates.whatif.hardware import Device, device, device_named
from gates.whatif.records import (
    busy_measured,
    kv_cache_gib,
    low_load_measured,
    served_axes,
    stage_shape,
)
from gates.whatif.scheduler import SchedulerConfig
from gates.whatif.search import SimSettings, Workload, capacity, low_load
from gates.whatif.shape import ModelShape, stage_format
from gates.whatif.steptime import Roofline
from infra.errors import QuantgateError
from infra.placement import Gpu
from load.profile import Slo

DEFAULT_GPUS = ("h100-sxm", "b200")
# Shorter than the what-if's defaults (10 s warm-up, 2,000 requests per rate, 10 bisection steps):
# the report is written at the end of every run and must not take minutes. The warm-up is what
# costs (a 135M model on an H100 runs at ~10^4 req/s: 10 s is 10^5 simulated requests per rate
# tried), and what catches a slowly growing queue. On the demo model (SmolLM2-135M, profile ci,
# H100 and B200) these read capacities -2 % to +8 % of the defaults' in a quarter of the time.
REPORT_SETTINGS = SimSettings(warmup_s=5.0, measured_requests=300, iterations=5)
# A 7B model's searches run at tens of req/s: about 1.5 s for the section. The CPU check runs at
# a few req/s, where the defaults are cheap (a few seconds) and 300 requests would read +20 %.
CPU_SETTINGS = SimSettings()
# When the caller does not pass the run's load profile (the records do not keep request sizes).
REFERENCE_WORKLOAD = Workload(prompt_tokens=1024, output_tokens=256,
                              slo=Slo(ttft_ms=1000.0, tpot_ms=40.0), target=0.99)
NOT_COMPARABLE = "not comparable: measured speed is of the dequantized bf16 twin"


@dataclass
class WhatifSection:
    """What the templates show; every figure in `rows` and `cpu_rows` is a prediction."""

    workload: str
    workload_source: str
    gpus: list[str]
    settings: str
    rows: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    measured_on: str = "CPU"  # what served the stages: the check's heading
    cpu_where: str = ("The model on the CPU of the machine writing this report (the records do "
                      "not keep which CPU measured them: write it where the stages ran)")
    cpu_device: str = ""
    cpu_source: str = ""
    cpu_knobs: str = ""
    cpu_settings: str = ""
    cpu_note: str = ""
    cpu_rows: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0


def _number(value: float | None, digits: str = ".1f") -> str:
    return "—" if value is None else format(value, digits)


def _ms(value: float | None) -> str:
    if value is None:
        return "—"
    return format(value, ".3f" if value < 1 else ".2f" if value < 10 else ".1f")


def rate_text(value: float | None) -> str:
    """A request rate as a reader writes it: 14,720, 540, 38.2, 0.412 (never 1e+03)."""
    return "—" if value is None else f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def _error(predicted: float | None, measured: float | None) -> str:
    if predicted is None or measured is None or not measured:
        return "—"
    error = predicted / measured - 1
    return "0%" if abs(error) < 0.005 else f"{error:+.0%}"


def describe_workload(workload: Workload) -> str:
    slo = workload.slo
    bounds = " and ".join(text for text in (
        f"TTFT ≤ {slo.ttft_ms:g} ms" if slo.ttft_ms else "",
        f"TPOT ≤ {slo.tpot_ms:g} ms" if slo.tpot_ms else "") if text)
    return (f"{workload.prompt_tokens} prompt / {workload.output_tokens} output tokens; capacity = "
            f"highest Poisson rate at which {workload.target:.0%} of requests meet {bounds}")


def _describe_settings(settings: SimSettings) -> str:
    warmup = (f"{settings.warmup_s:g} s of warm-up (at most {settings.max_warmup_requests} "
              "requests)" if settings.max_warmup_requests is not None
              else f"{settings.warmup_s:g} s of warm-up")
    return (f"{settings.measured_requests} simulated requests per rate after {warmup}, "
            f"{settings.iterations} bisection steps, seed {settings.seed}")


def _shapes(records: list[StageRecord], section: WhatifSection) -> dict[str, ModelShape]:
    shapes = {}
    for record in records:
        if record.facts is None and not record.shape:
            section.skipped.append(f"{record.name}: the engine never came up (no model shape)")
            continue
        found = stage_shape(record)
        if found.config is None:
            section.skipped.append(f"{record.name}: {found.source}")
            continue
        try:
            shapes[record.name] = ModelShape.from_config(found.config)
        except QuantgateError as err:
            section.skipped.append(f"{record.name}: {err}")
    return shapes


def one_user_tpot_ms(record: StageRecord, gpu: str = DEFAULT_GPUS[0]) -> float | None:
    """The TPOT one user of the reference workload sees on `gpu`, as the what-if predicts it for
    the record's format as it would ship (a mixed checkpoint on its shares); None: the record has
    no model shape or a format the what-if cannot read."""
    found = stage_shape(record)
    if found.config is None:
        return None
    try:
        shape = ModelShape.from_config(found.config)
        roofline = Roofline(shape, stage_format(served_axes(record), shape), device(gpu))
        return low_load(roofline, SchedulerConfig(), REFERENCE_WORKLOAD)[1]
    except QuantgateError:
        return None


def _gpu_rows(records: list[StageRecord], shapes: dict[str, ModelShape], targets: list[Device],
              workload: Workload, settings: SimSettings, section: WhatifSection) -> None:
    done: dict[str, list[dict[str, Any]]] = {}  # stages that serve alike are predicted once
    for record in records:
        if record.name not in shapes:
            continue
        axes = served_axes(record)
        key = json.dumps([shapes[record.name].model_dump(), axes], sort_keys=True)
        if key not in done:
            try:
                done[key] = [predict_stage(shapes[record.name], axes, target, workload,
                                           settings=settings) for target in targets]
            except QuantgateError as err:
                section.skipped.append(f"{record.name}: {err}")
                continue
        for row in done[key]:
            section.rows.append({
                "stage": record.name, "emulated": record.emulated, "gpu": row["gpu"],
                "ttft": _ms(row["ttft_ms"]), "tpot": _ms(row["tpot_ms"]),
                "capacity": rate_text(row["capacity_rps"]),
                "p99": f"{_ms(row['ttft_p99_ms'])} / {_ms(row['tpot_p99_ms'])}",
                "weights": _number(row["weights_gib"], ".2f"), "format": row["format"],
            })
            if row["source"] not in section.sources:
                section.sources.append(row["source"])


def _served_on(gpu: Gpu, section: WhatifSection) -> Device | None:
    """The data file's figures of the GPU a CUDA run served on; None (and why, in the section)
    where it has none."""
    gib = gpu.memory_bytes / 2**30
    section.measured_on = f"GPU: {gpu.name}"
    section.cpu_where = (f"The model on the GPU the stages served on ({gpu.name}, {gib:.1f} GiB, "
                         "as the run's placement names it)")
    found = device_named(gpu.name, gib)
    if found is None:
        section.cpu_note = (f"not made: the stages served on {gpu.name} ({gib:.1f} GiB), which "
                            "gates/whatif/gpus.yaml does not describe: add its figures there")
    return found


def _cpu_rows(records: list[StageRecord], shapes: dict[str, ModelShape], workload: Workload,
              settings: SimSettings, section: WhatifSection, described: Device | None,
              measured_on: Gpu | None = None) -> None:
    if measured_on is not None:
        described = _served_on(measured_on, section)
        if described is None:
            return
    baseline = next((r for r in records if r.kind == "baseline"), None)
    measured = low_load_measured(baseline) if baseline else None
    if baseline is None or measured is None or baseline.name not in shapes:
        section.cpu_note = ("not made: the baseline stage has no low-load measurement with one "
                            "user, or no model shape")
        return
    shape = shapes[baseline.name]
    scheduler = SchedulerConfig(kv_cache_gib=kv_cache_gib(baseline))
    try:
        described = described or cpu_device()
    except OSError as err:  # not Linux: no /proc/cpuinfo to describe the CPU from
        section.cpu_note = f"not made: this machine's CPU cannot be described ({err})"
        return
    section.cpu_device, section.cpu_source = described.name, described.source
    busy = busy_measured(baseline)
    try:
        fitted = calibrate(described, shape, stage_format(baseline.axes, shape),
                           Baseline(prompt_tokens=workload.prompt_tokens,
                                    output_tokens=workload.output_tokens,
                                    ttft_ms=measured[0], tpot_ms=measured[1],
                                    busy_users=busy[0] if busy else None,
                                    busy_tpot_ms=busy[1] if busy else None), scheduler)
    except QuantgateError as err:
        section.cpu_note = f"not made: calibration failed: {err}"
        return
    also = f" and TPOT {busy[1]:.2f} ms with {busy[0]} users" if busy else ""
    section.cpu_knobs = (f"{fitted.efficiency.describe()} (fitted to {baseline.name}'s low-load "
                         f"TTFT {measured[0]:.1f} ms and TPOT {measured[1]:.2f} ms{also})")
    section.cpu_settings = _describe_settings(settings)
    done: dict[str, tuple[float, float, float | None]] = {}  # stages that serve alike: once
    for record in records:
        if record.name not in shapes or record.load is None:
            continue
        seen = low_load_measured(record)
        config = SchedulerConfig(kv_cache_gib=kv_cache_gib(record))
        axes = served_axes(record)
        key = json.dumps([shapes[record.name].model_dump(), axes, config.kv_cache_gib],
                         sort_keys=True)
        try:
            if key not in done:
                roofline = Roofline(shapes[record.name],
                                    stage_format(axes, shapes[record.name]), fitted)
                ttft, tpot = low_load(roofline, config, workload)
                done[key] = (ttft, tpot, capacity(roofline, config, workload, settings)[0])
        except QuantgateError as err:
            section.skipped.append(f"{record.name} on the CPU: {err}")
            continue
        ttft, tpot, most = done[key]
        searched = record.load.capacity_note is not None
        measured_rate = record.load.capacity_rps if searched else None
        if record.name == baseline.name:
            note = "calibration point (fitted to it)"
        elif record.emulated:
            note = NOT_COMPARABLE
        elif record.kind == "control":
            note = "serves the baseline again: its error is the run-to-run noise"
        else:
            note = ""
        comparable = not record.emulated
        section.cpu_rows.append({
            "stage": record.name, "emulated": record.emulated, "note": note,
            "ttft": _ms(ttft), "ttft_measured": _ms(seen[0] if seen else None),
            "ttft_error": _error(ttft, seen[0] if seen else None) if comparable else "—",
            "tpot": _ms(tpot), "tpot_measured": _ms(seen[1] if seen else None),
            "tpot_error": _error(tpot, seen[1] if seen else None) if comparable else "—",
            "capacity": rate_text(most),
            "capacity_measured": (rate_text(measured_rate) if measured_rate is not None
                                  else "none passed" if searched else "not searched"),
            "capacity_error": _error(most, measured_rate) if comparable else "—",
            # Numbers for the benchmark script and tests.
            "values": {"ttft": ttft, "tpot": tpot, "capacity": most,
                       "ttft_measured": seen[0] if seen else None,
                       "tpot_measured": seen[1] if seen else None,
                       "capacity_measured": measured_rate, "comparable": comparable},
        })


def whatif_section(
    records: list[StageRecord],
    workload: Workload | None = None,
    workload_source: str = "",
    gpus: Sequence[str | Device] = DEFAULT_GPUS,
    settings: SimSettings = REPORT_SETTINGS,
    cpu: bool = True,
    cpu_settings: SimSettings = CPU_SETTINGS,
    cpu_described: Device | None = None,
    gpu_workload: Workload | None = None,
    measured_on: Gpu | None = None,
) -> WhatifSection:
    """The section's content. `workload`: the run's load profile (workload_from_profile), for
    the check against the run's own measurement on `cpu_described` (default: this machine's CPU,
    `gates.whatif.cpu.cpu_device`; the records do not keep the measuring machine's); None: no
    check. The GPU table predicts `gpu_workload`, by default the reference GPU serving workload
    (1,024 / 256 tokens, TTFT <= 1 s and TPOT <= 40 ms at p99): a profile sized for this CPU
    says nothing of a GPU fleet's SLO. `measured_on`: the GPU a CUDA run's stages served on
    (its placement's), which the check is made on instead of this machine's CPU."""
    started = time.perf_counter()
    if gpu_workload is None:
        workload_source = ("the reference GPU serving workload (the published H100 table's); "
                           "`quantgate whatif --profile` predicts another")
    targets = [device(gpu) if isinstance(gpu, str) else gpu for gpu in gpus]
    chosen = gpu_workload or REFERENCE_WORKLOAD
    section = WhatifSection(workload=describe_workload(chosen), workload_source=workload_source,
                            gpus=[t.key for t in targets], settings=_describe_settings(settings))
    shapes = _shapes(records, section)
    _gpu_rows(records, shapes, targets, chosen, settings, section)
    if not cpu:
        section.cpu_note = "not made (turned off)"
    elif workload is None:
        section.cpu_note = ("not made: the baseline's measurement can only be fitted at the run's "
                            "own request sizes, and no load profile was passed")
    else:
        _cpu_rows(records, shapes, workload, cpu_settings, section, cpu_described, measured_on)
    section.seconds = time.perf_counter() - started
    return section
