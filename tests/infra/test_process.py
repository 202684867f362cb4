"""infra/process.py: a logged process's readiness, its log's tail, and a stop that escalates."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from infra.ports import free_port, port_free
from infra.process import LoggedProcess, log_tail, stop_group
from infra.quiet import QUIET_ENV, quiet

PYTHON = [sys.executable, "-c"]


def _wait_for(path: Path, text: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text():
            return
        time.sleep(0.05)
    raise AssertionError(f"{text!r} never appeared in {path}")


def test_a_process_that_dies_reports_its_log_tail(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    code = "import sys\nfor i in range(40): print(f'line {i}')\nprint('boom', file=sys.stderr)\nsys.exit(3)"
    process = LoggedProcess([*PYTHON, code], log)
    with pytest.raises(RuntimeError, match=r"(?s)exited with code 3 \(log .*server.log\):\n.*boom") as err:
        process.wait_ready(lambda: False, 30, RuntimeError, poll_s=0.05)
    assert "line 39" in str(err.value) and "line 20" not in str(err.value)  # the last 15 lines only


def test_a_process_never_ready_times_out_with_its_log_tail(tmp_path: Path) -> None:
    log = tmp_path / "slow.log"
    process = LoggedProcess([*PYTHON, "import time; print('warming up', flush=True); time.sleep(60)"], log)
    try:
        _wait_for(log, "warming up")
        with pytest.raises(ValueError, match=r"(?s)^engine not healthy after 0.3 s .*warming up"):
            process.wait_ready(lambda: False, 0.3, ValueError, poll_s=0.05,
                               not_ready="engine not healthy after {timeout:g} s (log {log}):\n{tail}")
        assert process.alive()
    finally:
        process.stop(grace_s=5)
    assert not process.alive()


def test_a_ready_process_returns_and_its_output_goes_to_the_log(tmp_path: Path) -> None:
    log = tmp_path / "ok.log"
    log.write_text("kept\n")
    process = LoggedProcess([*PYTHON, "import time; print('up', flush=True); time.sleep(60)"], log,
                            append=True)
    try:
        process.wait_ready(lambda: "up" in log.read_text(), 10, RuntimeError, poll_s=0.05)
        assert process.stdout is None and log.read_text().startswith("kept\nup")
        assert os.getpgid(process.pid) == process.pid  # a group of its own
    finally:
        process.stop(grace_s=5)


def test_stop_escalates_to_sigkill_for_a_process_ignoring_sigterm(tmp_path: Path) -> None:
    log = tmp_path / "stubborn.log"
    code = ("import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "print('ignoring', flush=True)\ntime.sleep(60)")
    process = LoggedProcess([*PYTHON, code], log)
    _wait_for(log, "ignoring")
    started = time.monotonic()
    stop_group(process, grace_s=0.5)
    assert process.returncode == -signal.SIGKILL
    assert time.monotonic() - started < 10


def test_stop_reaches_what_the_process_started(tmp_path: Path) -> None:
    log = tmp_path / "tree.log"
    code = ("import subprocess, sys, time\n"
            "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
            "print('child', child.pid, flush=True)\ntime.sleep(60)")
    process = LoggedProcess([*PYTHON, code], log)
    _wait_for(log, "child ")
    child = int(log.read_text().split()[-1])
    process.stop(grace_s=5)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        raise AssertionError(f"the child {child} outlived its group's stop")


def test_stop_reaches_what_a_dead_leader_left_in_its_group(tmp_path: Path) -> None:
    """A server killed from outside leaves its children running in its group (vLLM's API server
    its engine-core process): stopping it stops them, SIGKILL for one that ignores SIGTERM."""
    import psutil

    log = tmp_path / "orphans.log"
    child = ("import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
             "print('ignoring', flush=True)\ntime.sleep(60)")
    code = ("import subprocess, sys\n"
            "polite = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
            f"stubborn = subprocess.Popen([sys.executable, '-c', {child!r}])\n"
            "print('children', polite.pid, stubborn.pid, flush=True)\n")
    process = LoggedProcess([*PYTHON, code], log)
    _wait_for(log, "ignoring")
    children = [psutil.Process(int(pid)) for pid in log.read_text().split()[1:3]]
    process.wait(timeout=30)  # the leader is gone, its children are not
    assert all(child.is_running() for child in children)
    process.stop(grace_s=1)
    _, alive = psutil.wait_procs(children, timeout=10)
    assert [c for c in alive if c.status() != psutil.STATUS_ZOMBIE] == []


def test_stopping_a_gone_process_is_quiet(tmp_path: Path) -> None:
    process = LoggedProcess([*PYTHON, "pass"], tmp_path / "done.log")
    process.wait(timeout=30)
    process.stop()
    stop_group(None)
    assert process.returncode == 0


def test_log_tail_gives_the_last_lines_or_says_the_log_is_missing(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    assert log_tail(log) == "(no log)"
    assert log_tail(log, missing=f"(no log at {log})") == f"(no log at {log})"
    log.write_text("".join(f"{i}\n" for i in range(50)))
    assert log_tail(log, 3) == "47\n48\n49"
    assert len(log_tail(log).splitlines()) == 15


def test_one_quiet_environment_with_one_value_per_variable() -> None:
    assert QUIET_ENV["DO_NOT_TRACK"] == "1"  # the value vLLM (only "1") and Prefect both honour
    assert quiet("DO_NOT_TRACK", "HF_HUB_OFFLINE") == {"DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1"}
    with pytest.raises(KeyError):
        quiet("NOT_A_QUIET_VARIABLE")


def test_a_free_port_is_free() -> None:
    port = free_port()
    assert 0 < port < 65536 and port_free("127.0.0.1", port)
