"""Bounds on the numbers users write: values that cannot be meant are refused where they are read.

Every user-edited model also sets `allow_inf_nan=False` (pydantic's `finite_number` error, which
the YAML loader explains): a limit is never switched off by `.inf`, and `.nan` compares false
with everything, so it would pass or fail every rule it touches.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator

MAX_SECONDS = 86_400  # a day: no wait, timeout or measured window of one run is meant to be longer
MAX_SOAK_SECONDS = 30 * MAX_SECONDS  # a measured window asked for as a soak run (its own field)
MAX_COUNT = 1_000_000  # requests, users, tokens of one request: beyond this a typo, not a plan
MAX_RESAMPLES = 100_000  # bootstrap resamples: at 10^5 the Monte Carlo error is far below any margin


def at_most(limit: int | float, unit: str, why: str) -> AfterValidator:
    """An AfterValidator refusing a value above `limit` (`unit` written after it, e.g. " s"),
    saying what the bound is and why."""

    def check(value: int | float) -> int | float:
        if value > limit:
            raise ValueError(f"at most {limit:,}{unit} ({why}); give a smaller value")
        return value

    return AfterValidator(check)


Seconds = Annotated[float, at_most(MAX_SECONDS, " s", "a day: a longer wait cannot be meant")]
Count = Annotated[int, at_most(MAX_COUNT, "", "more cannot be meant in one run")]
_SOAK = at_most(MAX_SOAK_SECONDS, " s", "30 days, even for a soak run").func


def day_at_most(seconds: float | None, opt_in: str) -> None:
    """Seconds's bound, naming the field's `opt_in` to a longer one (a ValueError, as pydantic's)."""
    if seconds is not None and seconds > MAX_SECONDS:
        raise ValueError(f"at most {MAX_SECONDS:,} s (a day: a longer wait cannot be meant; "
                         f"{opt_in}); give a smaller value")


def soak_at_most(seconds: float | None) -> None:
    """The bound of a window asked for as a soak run: 30 days."""
    if seconds is not None:
        _SOAK(seconds)
