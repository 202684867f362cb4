"""The one root exception of quantgate and its few kinds."""

from __future__ import annotations

import difflib


class QuantgateError(Exception):
    """Root of every error quantgate raises on purpose; the CLI turns it into one line + exit 2."""


class SpecError(QuantgateError):
    """A spec, profile, policy or eval set is invalid."""


class CheckpointError(QuantgateError):
    """A checkpoint directory is missing or is not a model."""


class EngineError(QuantgateError):
    """An engine could not start, died, or answered nonsense."""


class PortInUseError(EngineError):
    """The engine's port is taken: the environment's fault, not the candidate's."""


class GpuBusyError(EngineError):
    """An engine's GPUs lack the free memory its share needs (a stopped engine has not let go,
    or another process holds it): the host's fault, not the candidate's."""


class MeasurementError(QuantgateError):
    """A measurement (quality, load) could not be completed."""


def did_you_mean(value: str, choices: list[str] | tuple[str, ...]) -> str:
    """A hint naming the closest valid choice, or all of them."""
    close = difflib.get_close_matches(value, list(choices), n=1)
    valid = ", ".join(sorted(choices))
    if close:
        return f"did you mean {close[0]!r}? (valid: {valid})"
    return f"valid: {valid}"
