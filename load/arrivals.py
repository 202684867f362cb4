"""The open loop's arrival schedule: Poisson arrivals fixed in advance from a seeded generator."""

from __future__ import annotations

import random


class Arrivals:
    """A Poisson schedule: the k-th call returns the k-th arrival time (perf_counter seconds).

    The first arrival is at `start`, as in `vllm bench serve`, so the measured window (which
    opens the warm-up after the first request) is anchored to the schedule, whatever the rate.
    """

    def __init__(self, rate: float, seed: str, start: float, for_s: float = 0.0) -> None:
        self._rng = random.Random(seed)
        self._rate = rate
        self._next = start
        self._last = start + for_s if for_s > 0 else float("inf")

    def take(self) -> float | None:
        """The next arrival's time; None once the schedule has ended."""
        # No gevent switch in here: takes are atomic among the users of one process.
        due = self._next
        if due > self._last:
            return None
        self._next += self._rng.expovariate(self._rate)
        return due
