"""Capacity what-if: predicted latency and SLO capacity of each stage on target GPUs.

From the model shape in config.json and each stage's axes, a roofline gives the time of one
engine step, and a discrete-event model of vLLM's scheduler (token budget, running-sequence
limit, chunked prefill, KV block pool, preemption) serves seeded Poisson arrivals through it.
Every figure is a prediction, labelled with its source.

`section.whatif_section` makes the sign-off report's section from stage records (`records`: the
model shape and KV pool a record kept), and checks the model against the run's own measurement
on this machine's CPU (`cpu`: nominal peaks; `calibrate`: the two knobs fitted to the baseline).
`quantgate whatif SPEC|RUN_DIR --gpu ...` prints the table.

Step times come from the roofline only, not from aiconfigurator's measured tables. Checked with
aiconfigurator-core 0.12.0 (PyPI wheel, 82 MB, a Rust extension plus parquet tables):

- its vLLM GEMM tables for H100 / H200 (vLLM 0.24.0) hold bfloat16, fp8 and fp8_block only, and
  for A100 (vLLM 0.14.0) bfloat16 only: no int4 weight-only (W4A16) kernels, so a W4A16 stage,
  one of the formats this what-if exists for, would fall back to the roofline anyway (int4_wo is
  measured for TensorRT-LLM on A100 only);
- Qwen2.5-7B's MLP widths (18,944; 37,888 fused) are off its (m, n, k) grid, so every MLP GEMM
  would be an interpolation;
- using it means a new 82 MB dependency in the project environment (or a second environment and
  a subprocess per prediction) for a table lookup that the roofline, with two stated
  efficiencies, already matches to within 10 % on the published H100 table.

Its H100 system file agrees with gpus.yaml on peaks and uses 0.8 of bandwidth; gpus.yaml's
efficiencies are in the same range.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from gates.whatif.hardware import Device, device, load_devices
from gates.whatif.scheduler import SchedulerConfig, kv_pool_blocks
from gates.whatif.search import SimSettings, Workload, at_rate, capacity, low_load
from gates.whatif.shape import ModelShape, stage_format
from gates.whatif.steptime import Roofline
from infra.errors import SpecError
from infra.values import MAX_COUNT
from load.profile import LoadProfile, Slo

__all__ = [
    "SchedulerConfig",
    "SimSettings",
    "Workload",
    "load_devices",
    "markdown",
    "whatif_table",
    "workload_from_profile",
]

LABEL = "prediction"


def workload_from_profile(profile: LoadProfile) -> Workload:
    """The load profile's request sizes, SLO and target (default SLO: TTFT 1 s, TPOT 40 ms)."""
    slo = profile.slo or Slo(ttft_ms=1000.0, tpot_ms=40.0)
    return Workload(
        prompt_tokens=profile.prompt_tokens,
        output_tokens=profile.output_tokens,
        slo=slo,
        target=profile.capacity.target,
    )


def _named(stages: Mapping[str, Mapping[str, Any]] | Sequence[Mapping[str, Any]]) -> dict[str, dict]:
    if isinstance(stages, Mapping):
        return {str(name): dict(axes) for name, axes in stages.items()}
    named = {}
    for index, axes in enumerate(stages):
        name = str(axes.get("name") or f"stage{index}")
        named[name] = {key: value for key, value in axes.items() if key != "name"}
    return named


def predict_stage(
    shape: ModelShape,
    axes: Mapping[str, Any],
    target: Device,
    workload: Workload,
    scheduler: SchedulerConfig | None = None,
    settings: SimSettings | None = None,
    rate: float | None = None,
) -> dict[str, Any]:
    """One row of the table: one stage on one device (and its p99s at `rate` if given)."""
    scheduler = scheduler or SchedulerConfig()
    fmt = stage_format(dict(axes), shape)
    roofline = Roofline(shape, fmt, target)
    ttft, tpot = low_load(roofline, scheduler, workload)
    most, how, _ = capacity(roofline, scheduler, workload, settings)
    at = at_rate(roofline, scheduler, workload, most, settings) if most else None
    asked = at_rate(roofline, scheduler, workload, rate, settings) if rate else None
    note = fmt.note
    if roofline.matmul_dtype != fmt.compute_dtype:
        note += f" ({target.key} has no {fmt.compute_dtype}: matmuls in {roofline.matmul_dtype})"
    return {
        "gpu": target.key,
        "weights_gib": fmt.resident_weight_bytes(shape) / 2**30,
        "kv_pool_tokens": kv_pool_blocks(roofline, scheduler) * scheduler.block_size,
        "ttft_ms": ttft,
        "tpot_ms": tpot,
        "capacity_rps": most,
        "ttft_p99_ms": at.ttft_p99_ms if at else None,
        "tpot_p99_ms": at.tpot_p99_ms if at else None,
        **(
            {
                "rate_rps": rate,
                "rate_ttft_p99_ms": asked.ttft_p99_ms,
                "rate_tpot_p99_ms": asked.tpot_p99_ms,
                "rate_goodput": asked.step.goodput,
            }
            if asked
            else {}
        ),
        "search": how,
        "format": note,
        "source": roofline.source,
        "label": LABEL,
    }


def whatif_table(
    config_json: Mapping[str, Any],
    stages: Mapping[str, Mapping[str, Any]] | Sequence[Mapping[str, Any]],
    gpus: Sequence[str | Device],
    workload: Workload,
    scheduler: SchedulerConfig | None = None,
    settings: SimSettings | None = None,
    rate: float | None = None,
) -> pd.DataFrame:
    """Predicted low-load TTFT / TPOT and SLO capacity, one row per (stage, GPU).

    config_json: the checkpoint's config.json as a dict (the model shape).
    stages: stage name -> axes (flows.axes.Axes.model_dump(): weights, activations, kv_cache),
      or a list of such dicts with a 'name' key.
    gpus: keys of gpus.yaml ('a100-80g', 'h100-sxm', 'h200', 'b200', 'l40s') or Device objects
      (e.g. a calibrated CPU from gates.whatif.calibrate).
    workload: request sizes and SLO; `workload_from_profile(load_profile)` makes one.
    Columns: stage, gpu, weights_gib, kv_pool_tokens, ttft_ms, tpot_ms (low load), capacity_rps
    (max Poisson rate meeting the SLO for `target` of requests; None when even the lowest rate
    tried fails), ttft_p99_ms, tpot_p99_ms (at that rate), search, format, source, label; with
    `rate` (req/s) also rate_rps, rate_ttft_p99_ms, rate_tpot_p99_ms, rate_goodput at that rate.
    scheduler: vLLM's batching flags (defaults: 8,192-token budget, 1,024 sequences, 0.9 memory).
    settings: simulated requests per rate, seed, bisection steps (defaults: 2,000, 0, 10).
    """
    scheduler = scheduler or SchedulerConfig()
    if rate is not None:
        check_rate(rate, settings or SimSettings())
    shape = ModelShape.from_config(dict(config_json))
    targets = [device(gpu) if isinstance(gpu, str) else gpu for gpu in gpus]
    rows = [
        {"stage": name, **predict_stage(shape, axes, target, workload, scheduler, settings, rate)}
        for name, axes in _named(stages).items()
        for target in targets
    ]
    return pd.DataFrame(rows)


def check_rate(rate: float, settings: SimSettings) -> None:
    """Refuse a rate the simulation cannot run: not a finite number above 0, or one whose
    warm-up alone draws more arrivals than one run can mean (each is an array element)."""
    if not 0 < rate < float("inf"):  # nan compares false: refused too
        raise SpecError(f"--rate must be a finite number above 0 req/s, got {rate:g}")
    warmup = math.ceil(rate * settings.warmup_s)
    if settings.max_warmup_requests is not None:
        warmup = min(warmup, settings.max_warmup_requests)
    if warmup + settings.measured_requests > MAX_COUNT:
        most = (MAX_COUNT - settings.measured_requests) / max(settings.warmup_s, 1e-9)
        raise SpecError(f"--rate {rate:g} req/s: the simulation would draw {float(warmup):.3g} warm-up "
                        f"arrivals ({settings.warmup_s:g} s at that rate), over {MAX_COUNT:,} in one "
                        f"run; give a rate of at most {most:,.0f} req/s")


def markdown(table: pd.DataFrame, workload: Workload) -> str:
    """The table as Markdown, headed by what it assumes and that it is a prediction."""
    slo = workload.slo
    bounds = " and ".join(
        text for text in (
            f"TTFT ≤ {slo.ttft_ms:g} ms" if slo.ttft_ms else "",
            f"TPOT ≤ {slo.tpot_ms:g} ms" if slo.tpot_ms else "",
        ) if text
    )
    lines = [
        f"**Prediction, not a measurement.** {workload.prompt_tokens} prompt / "
        f"{workload.output_tokens} output tokens; capacity = highest Poisson rate at which "
        f"{workload.target:.0%} of requests meet {bounds}.",
        "",
        "| stage | GPU | low-load TTFT ms | low-load TPOT ms | capacity req/s "
        "| p99 TTFT / TPOT ms at capacity | weights GiB | format |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]

    def number(value: Any, digits: str = ".1f") -> str:
        return "—" if value is None or pd.isna(value) else format(value, digits)

    for row in table.itertuples():
        lines.append(
            f"| {row.stage} | {row.gpu} | {number(row.ttft_ms)} | {number(row.tpot_ms, '.2f')} "
            f"| {number(row.capacity_rps)} | {number(row.ttft_p99_ms, '.0f')} / "
            f"{number(row.tpot_p99_ms)} | {number(row.weights_gib)} | {row.format} |"
        )
    sources = sorted(set(table["source"])) if len(table) else []
    lines += ["", *(f"Source: {source}." for source in sources)]
    return "\n".join(lines)
