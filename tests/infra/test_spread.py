"""infra.spread: forked workers compute and nothing else, even when signalled as they start."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from infra.spread import HANDLED, _leave_signals, spread

REPO = Path(__file__).resolve().parents[2]


def _square(job: int) -> int:
    return job * job


def test_results_come_back_in_job_order():
    assert spread(_square, list(range(7))) == [job * job for job in range(7)]


def _blocked(_job: int) -> list[int]:
    return sorted(int(sig) for sig in signal.pthread_sigmask(signal.SIG_BLOCK, []))


def test_workers_are_forked_with_the_handled_signals_blocked_until_their_handlers_are_set(
        tmp_path):
    """A pool's terminate sends SIGTERM to every worker (on the first job's error), and Ctrl-C
    reaches the whole process group, some workers maybe still starting. A worker forked with
    the parent's Python handler (`quantgate` raises SystemExit on SIGTERM, flows/cli.py) and
    signalled before its initializer raised at the fork's return, unwound the parent's stack
    and ran on as a second copy of the caller: under pytest-xdist it took tests from the
    parent's channel (a unit-tier hang in sessions 42 and 44). At the fork the signals are
    blocked, so none is delivered before the worker's own handlers; then they are let in."""
    script = textwrap.dedent(f"""
        import os, signal
        from infra.spread import HANDLED, _leave_signals, spread
        from tests.infra.test_spread import _blocked

        def at_fork():
            with open({str(tmp_path / "masks")!r}, "a") as out:
                out.write(" ".join(str(int(s)) for s in sorted(
                    signal.pthread_sigmask(signal.SIG_BLOCK, []))) + "\\n")

        os.register_at_fork(after_in_child=at_fork)
        print(spread(_blocked, [1, 2, 3, 4]), sorted(signal.pthread_sigmask(signal.SIG_BLOCK, [])))
    """)
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                            text=True, timeout=120, env={"PYTHONPATH": str(REPO)})
    assert result.returncode == 0, result.stderr
    handled = {int(sig) for sig in HANDLED}
    at_fork = [set(map(int, line.split())) for line in (tmp_path / "masks").read_text().splitlines()]
    assert at_fork and all(handled <= mask for mask in at_fork), at_fork
    assert result.stdout.strip() == "[[], [], [], []] []", "let in again: workers and parent"


def test_a_worker_dies_of_sigterm_whatever_its_forked_caller_had():
    """A worker forked from a caller for whom SIGTERM does not end the process (ignored, or a
    handler already stopping) would outlive the pool's terminate(), whose join then waits for
    ever: a unit tier hung there (tools/benchmarks/decisions.py's pool), its worker blocked on
    the task queue's lock. The initializer takes SIGTERM and SIGHUP as the default, leaves
    Ctrl-C to the parent, and lets the signals in."""
    saved = {sig: signal.getsignal(sig) for sig in HANDLED}
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_BLOCK, HANDLED)
    try:
        _leave_signals(mask)  # in each worker, with the mask its parent had before the fork
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_DFL
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == mask
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for sig, handler in saved.items():
            if handler is not None:
                signal.signal(sig, handler)
