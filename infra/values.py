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
SoakSeconds = Annotated[float, at_most(MAX_SOAK_SECONDS, " s", "30 days, even for a soak run")]


def longer_than_a_day(field: str, seconds: float | None, opt_in: str) -> str | None:
    """Why `seconds` of `field` is refused without the model's opt-in field `opt_in`, or None."""
    if seconds is None or seconds <= MAX_SECONDS:
        return None
    return (f"{field} {seconds:,g} s is over a day ({MAX_SECONDS:,} s), which no run means by "
            f"accident: give at most {MAX_SECONDS:,} s, or set {opt_in}: true to ask for it (up to "
            f"{MAX_SOAK_SECONDS:,} s)")
