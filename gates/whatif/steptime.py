"""Time of one engine step from a roofline: compute time or memory time, whichever is longer."""

from __future__ import annotations

from typing import Any

import numpy as np

from gates.whatif.hardware import Device
from gates.whatif.shape import ModelShape, StageFormat


class Roofline:
    """Step time of one model + format on one device.

    A step runs the body matmuls over every scheduled token (in the stage's compute dtype), the
    LM head over the rows that sample and attention over each sequence's cached context (both
    bf16), and streams the weights once plus every scheduled sequence's KV. It takes
    max(FLOPs / (peak x compute efficiency), bytes / (bandwidth x memory efficiency)) plus a fixed
    overhead per step and one per sampled sequence. Activation traffic is left out: it is small
    next to weights and KV.
    """

    def __init__(self, shape: ModelShape, fmt: StageFormat, device: Device) -> None:
        self.shape, self.fmt, self.device = shape, fmt, device
        eff = device.efficiency
        compute = device.peak_flops(self.matmul_dtype) * eff.compute
        bf16 = device.peak_flops("bf16") * eff.compute
        bandwidth = device.bandwidth * eff.memory
        # Seconds per unit of work, fixed for the stage: a step is then a few multiplications.
        self.body_token_s = 2.0 * shape.body_params / compute
        self._logit_row_s = 2.0 * shape.head_params / bf16
        self._attention_flop_s = 1.0 / bf16
        self._weights_s = fmt.weight_bytes(shape) / bandwidth
        self._kv_token_s = fmt.kv_bytes_per_token(shape) / bandwidth
        self._overhead_s = eff.step_overhead_ms / 1e3
        self._sequence_s = eff.sequence_ms / 1e3

    @property
    def matmul_dtype(self) -> str:
        """The stage's compute dtype, or bf16 where the device lacks it (vLLM then runs the
        format weight-only, e.g. FP8 as Marlin W8A16 on an A100)."""
        wanted = self.fmt.compute_dtype
        return wanted if self.device.supports(wanted) else "bf16"

    @property
    def source(self) -> str:
        return f"roofline, efficiencies {self.device.efficiency.describe()}"

    def step_s(self, tokens: Any, logit_rows: Any, attention_flops: Any, kv_tokens_read: Any) -> Any:
        """Seconds of a step (floats, or numpy arrays for many steps at once): `tokens` scheduled,
        `logit_rows` sampled, attention FLOPs, and KV tokens read (cached context of every
        scheduled sequence)."""
        compute = (
            tokens * self.body_token_s
            + logit_rows * self._logit_row_s
            + attention_flops * self._attention_flop_s
        )
        memory = self._weights_s + kv_tokens_read * self._kv_token_s
        return np.maximum(compute, memory) + self._overhead_s + logit_rows * self._sequence_s
