"""Pure computations spread over the cores: validate's power simulations, the what-if's stages."""

from __future__ import annotations

import multiprocessing
import os
import signal
from collections.abc import Callable
from typing import TypeVar

Job = TypeVar("Job")
Result = TypeVar("Result")


def spread(work: Callable[[Job], Result], jobs: list[Job]) -> list[Result]:
    """`work` on each job in forked worker processes, one per core, results in job order. A fork
    is safe here: a worker only computes (CPython renews the import and logging locks in a forked
    child, and no worker takes another lock a thread of the parent may hold); a fresh interpreter
    (spawn) would import the caller's main module again, which a script without a main guard
    cannot take. `work` must be a module-level function, and each job seeds its own draws, so the
    results are those of one process running the jobs in turn."""
    workers = min(len(jobs), len(os.sched_getaffinity(0)))
    if workers <= 1:
        return [work(job) for job in jobs]
    with multiprocessing.get_context("fork").Pool(workers, initializer=_leave_signals) as pool:
        return pool.map(work, jobs, chunksize=1)  # leaving the block terminates the workers


def _leave_signals() -> None:
    """Ctrl-C and SIGTERM reach the whole process group: the parent handles them and stops the
    pool. A worker forked with the parent's handlers would act as the parent (flows.interrupt)
    or wait on a queue for ever; it takes SIGTERM as the default and leaves Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
