"""The weight formats quantgate can emulate, and the bit-for-bit check of their dequantized twins.

Each format is made by llmcompressor as a real compressed-tensors checkpoint, then decoded into a bf16
twin that any engine serves. Stdlib only at import time: ``make_candidates.py`` loads this file by path
inside llmcompressor's own venv, and the main venv imports it as ``infra.formats``.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEMO_PREFIX = "smollm2-135m"
TWIN_SUFFIX = "-dequant"
METHODS = ("rtn", "gptq")
# GPTQ calibration: short on purpose (2 CPU cores); text from the repo's own documentation.
CALIBRATION_SAMPLES = 64
CALIBRATION_TOKENS = 256


def _int_weights(group_size: int) -> dict[str, Any]:
    return {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": group_size}


def _fp8_weights(strategy: str, **extra: Any) -> dict[str, Any]:
    return {"num_bits": 8, "type": "float", "symmetric": True, "strategy": strategy, **extra}


@dataclass(frozen=True)
class WeightFormat:
    """One weight-only format: a compressed-tensors preset or explicit weight args, and how to round."""

    name: str
    summary: str
    preset: str | None = None  # compressed-tensors' own preset scheme, used unchanged
    weights: Mapping[str, Any] = field(default_factory=dict)  # QuantizationArgs fields otherwise
    method: str = "rtn"  # rtn: data-free round-to-nearest; gptq: GPTQ on calibration text
    group_size: int | None = None  # layers whose input width it does not divide stay bf16

    def __post_init__(self) -> None:
        if (self.preset is None) == (not self.weights):
            raise ValueError(f"format {self.name!r}: give exactly one of preset and weights")
        if self.method not in METHODS:
            raise ValueError(f"format {self.name!r}: method {self.method!r} is not one of {METHODS}")

    def candidate(self, prefix: str = DEMO_PREFIX) -> str:
        return f"{prefix}-{self.name}"

    def twin(self, prefix: str = DEMO_PREFIX) -> str:
        return f"{prefix}-{self.name}{TWIN_SUFFIX}"


FORMATS: dict[str, WeightFormat] = {
    f.name: f
    for f in (
        WeightFormat(
            "nvfp4",
            "FP4 E2M1 weights, groups of 16, FP8 E4M3 group scales and a per-tensor FP32 global scale",
            preset="NVFP4A16",
            group_size=16,
        ),
        WeightFormat(
            "mxfp4",
            "FP4 E2M1 weights, groups of 32, E8M0 (power-of-two, uint8) group scales",
            preset="MXFP4A16",
            group_size=32,
        ),
        *(
            WeightFormat(
                f"int4-g{group}-{method}",
                f"symmetric INT4 weights, groups of {group}, "
                + ("round-to-nearest" if method == "rtn" else "GPTQ"),
                weights=_int_weights(group),
                method=method,
                group_size=group,
            )
            for group in (32, 128)
            for method in METHODS
        ),
        WeightFormat("fp8-tensor", "FP8 E4M3 weights, one scale per tensor", weights=_fp8_weights("tensor")),
        WeightFormat(
            "fp8-channel", "FP8 E4M3 weights, one scale per output channel", weights=_fp8_weights("channel")
        ),
        WeightFormat(
            "fp8-block",
            "FP8 E4M3 weights, one scale per 128x128 block (edge blocks are partial)",
            weights=_fp8_weights("block", block_structure=[128, 128]),
        ),
    )
}


def unknown_formats_message(names: list[str]) -> str | None:
    """One line naming every unknown format (with the closest known one), or None when all are known."""
    unknown = [name for name in names if name not in FORMATS]
    if not unknown:
        return None
    hints = []
    for name in unknown:
        close = difflib.get_close_matches(name, list(FORMATS), n=1)
        hints.append(f"{name!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    return f"unknown format {', '.join(hints)}; known formats: {', '.join(FORMATS)}"


def layers_left_unquantized(in_features: Mapping[str, int], group_size: int | None) -> list[str]:
    """Layers whose input width ``group_size`` does not divide: llmcompressor refuses to group them."""
    if group_size is None:
        return []
    return sorted(name for name, width in in_features.items() if width % group_size)


def calibration_files(repo: Path) -> list[Path]:
    """The repo's own prose (README and design notes), never the eval sets' items that the gates score."""
    found = [repo / "README.md", *repo.glob("*/*.md"), *repo.glob("evalsets/*/README.md")]
    top = len(repo.parts)  # skip models/ (model cards) and hidden folders (.venv*, .pytest_cache)
    return sorted({p for p in found if p.is_file() and not _skipped(p.parts[top])})


def _skipped(folder: str) -> bool:
    return folder == "models" or folder.startswith(".")


def bitwise_mismatches(expected: Mapping[str, Any], actual: Mapping[str, Any]) -> list[str]:
    """One line per tensor of ``expected`` that ``actual`` lacks or does not hold bit for bit.

    Compares raw bytes, so -0.0 vs 0.0 and differing NaN payloads count as differences.
    """
    problems = []
    for name in sorted(expected):
        want = expected[name]
        got = actual.get(name)
        if got is None:
            problems.append(f"{name}: missing")
            continue
        if got.dtype != want.dtype or tuple(got.shape) != tuple(want.shape):
            problems.append(
                f"{name}: {got.dtype} {tuple(got.shape)}, expected {want.dtype} {tuple(want.shape)}"
            )
            continue
        differing = int((_as_bytes(want) != _as_bytes(got)).reshape(want.numel(), -1).any(dim=1).sum())
        if differing:
            problems.append(f"{name}: {differing} of {want.numel()} values differ")
    return problems


def _as_bytes(tensor: Any) -> Any:
    import torch

    return tensor.detach().contiguous().reshape(-1).view(torch.uint8)
