"""Service-level objectives a GPU fleet is judged by, for predictions on target GPUs.

A load profile sized for this CPU (TTFT <= 4 s, TPOT <= 200 ms on the demo) says nothing of what
an H100 must meet. These presets are MLPerf Inference's server-scenario latency limits (p99 TTFT
and TPOT, `loadgen/mlperf.conf` of mlcommons/inference: "server" and "interactive" per model),
plus the reference the sign-off report uses. A profile names one with `gpu_slo`.
"""

from __future__ import annotations

from dataclasses import dataclass

MLPERF = "MLPerf Inference server-scenario limits (mlcommons/inference loadgen/mlperf.conf)"


@dataclass(frozen=True)
class GpuSlo:
    ttft_ms: float
    tpot_ms: float
    source: str


PRESETS: dict[str, GpuSlo] = {
    "reference": GpuSlo(1000, 40, "the reference GPU serving SLO (the published H100 table's)"),
    "mlperf-llama3.1-8b-server": GpuSlo(2000, 100, MLPERF),
    "mlperf-llama3.1-8b-interactive": GpuSlo(500, 30, MLPERF),
    "mlperf-llama2-70b-server": GpuSlo(2000, 200, MLPERF),
    "mlperf-llama2-70b-interactive": GpuSlo(450, 40, MLPERF),
    "mlperf-llama3.1-405b-server": GpuSlo(6000, 175, MLPERF),
    "mlperf-llama3.1-405b-interactive": GpuSlo(4500, 80, MLPERF),
}


def gpu_slo(name: str) -> GpuSlo:
    if name not in PRESETS:
        raise ValueError(f"unknown GPU SLO preset {name!r}; known: {', '.join(PRESETS)}")
    return PRESETS[name]
