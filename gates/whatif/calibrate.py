"""Fit the roofline's two efficiency knobs to a measured baseline, so other stages can be predicted.

The baseline stage is measured on a device the caller describes (peak FLOPS per dtype, memory
bandwidth): its low-load TTFT at a known prompt length fixes the compute efficiency (prefill is
compute-bound), its low-load TPOT fixes the memory efficiency (single-stream decode streams the
weights). The two are solved together, each by a bracketed root search on the same simulator
that makes the predictions, alternating until both settle.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from pydantic import BaseModel, ConfigDict, Field
from scipy.optimize import brentq

from gates.whatif.hardware import Device, Efficiency
from gates.whatif.scheduler import SchedulerConfig, simulate
from gates.whatif.search import Workload, low_load
from gates.whatif.shape import ModelShape, StageFormat
from gates.whatif.steptime import Roofline
from infra.errors import SpecError

LOWEST_EFFICIENCY = 1e-4


class Baseline(BaseModel):
    """What was measured on the baseline stage: low-load latency at known request sizes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    prompt_tokens: int = Field(gt=0)
    output_tokens: int = Field(gt=1)
    ttft_ms: float = Field(gt=0, description="Low-load (one request at a time) TTFT.")
    tpot_ms: float = Field(gt=0, description="Low-load TPOT.")
    busy_users: int | None = Field(default=None, gt=1, description="Concurrency of a second, "
                                   "busier measurement (the load profile's high level).")
    busy_tpot_ms: float | None = Field(default=None, gt=0, description="Its TPOT (p50): fits "
                                       "the per-sequence cost of a step.")

    @classmethod
    def from_throughput(
        cls,
        prompt_tokens: int,
        output_tokens: int,
        prefill_tokens_per_s: float,
        decode_tokens_per_s: float,
    ) -> Baseline:
        """From single-stream prefill and decode throughput (tokens/s)."""
        return cls(
            prompt_tokens=prompt_tokens,
            output_tokens=output_tokens,
            ttft_ms=prompt_tokens / prefill_tokens_per_s * 1e3,
            tpot_ms=1e3 / decode_tokens_per_s,
        )


def _with(device: Device, **knobs: float) -> Device:
    return device.model_copy(update={"efficiency": device.efficiency.model_copy(update=knobs)})


def _low_load(shape: ModelShape, fmt: StageFormat, device: Device, scheduler: SchedulerConfig,
              baseline: Baseline) -> tuple[float, float]:
    workload = Workload(prompt_tokens=baseline.prompt_tokens, output_tokens=baseline.output_tokens)
    return low_load(Roofline(shape, fmt, device), scheduler, workload)


def _busy_tpot(shape: ModelShape, fmt: StageFormat, device: Device, scheduler: SchedulerConfig,
               baseline: Baseline) -> float:
    """Median TPOT of `busy_users` requests that arrive together and decode side by side."""
    users = int(baseline.busy_users or 1)
    result = simulate(Roofline(shape, fmt, device), scheduler, np.zeros(users),
                      baseline.prompt_tokens, baseline.output_tokens,
                      measured=np.ones(users, dtype=bool))
    return float(np.median(result.tpot_ms))


def _solve_sequence(shape: ModelShape, fmt: StageFormat, device: Device,
                    scheduler: SchedulerConfig, baseline: Baseline) -> float:
    """The per-sequence ms at which the busy level's TPOT is matched (0 when the roofline
    alone is already as slow: batching costs nothing extra on this device)."""
    def gap(value: float) -> float:
        return _busy_tpot(shape, fmt, _with(device, sequence_ms=value), scheduler,
                          baseline) - float(baseline.busy_tpot_ms or 0)

    if gap(0.0) >= 0:
        return 0.0
    top = float(baseline.busy_tpot_ms or 1.0)
    if gap(top) < 0:
        return top
    return float(brentq(gap, 0.0, top, xtol=1e-6))


def _solve(
    predicted: Callable[[float], float], measured: float, knob: str, device: Device
) -> float:
    """The knob value in (0, 1] at which predicted(knob) equals measured."""
    if predicted(1.0) > measured:
        raise SpecError(
            f"measured {measured:.3g} ms is faster than {device.key}'s peak allows "
            f"({predicted(1.0):.3g} ms at {knob} efficiency 1): check the peak figures"
        )
    if predicted(LOWEST_EFFICIENCY) < measured:
        raise SpecError(
            f"measured {measured:.3g} ms is not explained by the {knob} efficiency: the other "
            "knob or the step overhead already makes it slower"
        )
    return float(
        brentq(lambda value: predicted(value) - measured, LOWEST_EFFICIENCY, 1.0, xtol=1e-7)
    )


def calibrate(
    device: Device,
    shape: ModelShape,
    fmt: StageFormat,
    baseline: Baseline,
    scheduler: SchedulerConfig | None = None,
    rounds: int = 30,
) -> Device:
    """`device` with compute and memory efficiency fitted to the baseline's TTFT and TPOT, and,
    with a busy measurement, the per-sequence step cost fitted to its TPOT (a third knob).

    The step overhead and memory reserve stay as the caller set them. Raises when the
    measurement cannot be matched (faster than peak, or slower than the other knob alone).
    """
    scheduler = scheduler or SchedulerConfig()

    def ttft(candidate: Device) -> Callable[[float], float]:
        return lambda value: _low_load(
            shape, fmt, _with(candidate, compute=value), scheduler, baseline
        )[0]

    def tpot(candidate: Device) -> Callable[[float], float]:
        return lambda value: _low_load(
            shape, fmt, _with(candidate, memory=value), scheduler, baseline
        )[1]

    # Start optimistic so that neither knob's floor hides the other's effect at first.
    fitted = _with(device, compute=1.0, memory=1.0)
    for _ in range(rounds):
        before = fitted.efficiency
        fitted = _with(fitted, compute=_solve(ttft(fitted), baseline.ttft_ms, "compute", fitted))
        fitted = _with(fitted, memory=_solve(tpot(fitted), baseline.tpot_ms, "memory", fitted))
        if baseline.busy_users and baseline.busy_tpot_ms:
            fitted = _with(fitted, sequence_ms=_solve_sequence(shape, fmt, fitted, scheduler,
                                                               baseline))
        after = fitted.efficiency
        if (abs(after.compute - before.compute) < 1e-6 and abs(after.memory - before.memory) < 1e-6
                and abs(after.sequence_ms - before.sequence_ms) < 1e-6):
            break
    return fitted


def describe_device(
    key: str,
    tflops: dict[str, float],
    bandwidth_gbs: float,
    memory_gib: float,
    name: str = "",
    step_overhead_ms: float = 0.0,
) -> Device:
    """A device the caller describes (e.g. this box's CPU), with placeholder efficiencies that
    `calibrate` replaces."""
    return Device(
        key=key,
        name=name or key,
        source="described by the caller",
        tflops=tflops,
        bandwidth_gbs=bandwidth_gbs,
        memory_gib=memory_gib,
        efficiency=Efficiency(
            compute=0.5, memory=0.5, step_overhead_ms=step_overhead_ms, reserved_memory_gib=0.0
        ),
    )
