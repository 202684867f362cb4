"""Stopping the service's workers: the flow runs under every worker are stopped first, all at
once, then the workers, which get a short grace (a Prefect process worker can take a minute to
honour SIGTERM) before SIGKILL."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from flows.service import stop_process_trees

# A flow run under a worker: notes SIGTERM in the shared log and exits.
RUN = """
import pathlib, signal, sys, time
log = pathlib.Path(sys.argv[1])
def stop(*_):
    with log.open("a") as out:
        out.write("run\\n")
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
pathlib.Path(sys.argv[2]).touch()
while True:
    time.sleep(0.05)
"""
# A worker that notes SIGTERM and goes on (as a slow Prefect worker does), with one run under it.
WORKER = """
import pathlib, signal, subprocess, sys, time
log = pathlib.Path(sys.argv[1])
def noted(*_):
    with log.open("a") as out:
        out.write("worker\\n")
signal.signal(signal.SIGTERM, noted)
subprocess.Popen([sys.executable, "-c", sys.argv[3], sys.argv[1], sys.argv[2]])
while True:
    time.sleep(0.05)
"""


def test_every_run_is_stopped_before_any_worker_and_a_worker_that_lingers_is_killed(tmp_path):
    log = tmp_path / "signals.log"
    ready = [tmp_path / f"run-{n}.ready" for n in range(2)]
    workers = [subprocess.Popen([sys.executable, "-c", WORKER, str(log), str(path), RUN])
               for path in ready]
    try:
        deadline = time.monotonic() + 60
        while not all(path.exists() for path in ready):
            assert time.monotonic() < deadline, "the runs did not start"
            time.sleep(0.05)
        stop_process_trees(workers, grace_s=30, worker_grace_s=0.5)
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
    # Both runs got SIGTERM and exited before either worker was signalled; the workers, which
    # ignored it, were killed after their grace.
    assert Path(log).read_text().splitlines() == ["run", "run", "worker", "worker"]
    assert [worker.returncode for worker in workers] == [-signal.SIGKILL] * 2
