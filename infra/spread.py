"""Pure computations spread over the cores: validate's power simulations, the what-if's stages."""

from __future__ import annotations

import multiprocessing
import multiprocessing.pool
import os
import signal
from collections.abc import Callable
from typing import TypeVar

Job = TypeVar("Job")
Result = TypeVar("Result")


# The signals quantgate's own processes handle in Python (flows.cli, flows.interrupt).
HANDLED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def spread(work: Callable[[Job], Result], jobs: list[Job]) -> list[Result]:
    """`work` on each job in forked worker processes, one per core, results in job order. A fork
    is safe here: a worker only computes (CPython renews the import and logging locks in a forked
    child, and no worker takes another lock a thread of the parent may hold); a fresh interpreter
    (spawn) would import the caller's main module again, which a script without a main guard
    cannot take. `work` must be a module-level function, and each job seeds its own draws, so the
    results are those of one process running the jobs in turn.

    The workers are forked with the handled signals blocked, and unblock them once their own
    handlers are set: a child forked with the parent's Python handler and signalled before its
    initializer (the pool's terminate, on the first job's error, sends SIGTERM to every worker)
    raised the parent's SystemExit at the fork's return, unwound the parent's stack in the child
    and ran on as a second copy of the caller (under pytest-xdist: a second worker on the same
    channel, and a hang or INTERNALERROR)."""
    workers = min(len(jobs), len(os.sched_getaffinity(0)))
    if workers <= 1:
        return [work(job) for job in jobs]
    with forked_pool(workers) as pool:
        return pool.map(work, jobs, chunksize=1)  # leaving the block terminates the workers


def forked_pool(workers: int) -> multiprocessing.pool.Pool:
    """A pool of `workers` forked processes that leave the parent's signals to it (spread's
    docstring); use it as a context manager, which terminates the workers on leaving."""
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, HANDLED)
    try:  # the pool's own threads, which fork replacement workers, keep the blocked mask
        return multiprocessing.get_context("fork").Pool(workers, initializer=_leave_signals,
                                                         initargs=(mask,))
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def _leave_signals(mask: set[signal.Signals]) -> None:
    """Ctrl-C and SIGTERM reach the whole process group: the parent handles them and stops the
    pool. A worker forked with the parent's handlers would act as the parent (flows.interrupt)
    or wait on a queue for ever; it leaves Ctrl-C, takes SIGTERM and SIGHUP as the default, and
    only then lets them in (one sent while it started is delivered now, and ends it)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
