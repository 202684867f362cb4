"""infra.spread: forked workers compute and nothing else, even when signalled as they start."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from infra.spread import HANDLED, spread

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
        from infra.spread import HANDLED, spread
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
