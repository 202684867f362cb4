"""The parent's side of the two-process protocol: start each process on its program, hand both
their input, read the judge's verdict (bounded, heard only with the run's secret), kill both
groups, and say why a run failed."""

from __future__ import annotations

import ast
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evalsets.sandbox_isolation import SANDBOX_DIR, Isolation
from evalsets.sandbox_programs import _BOOT
from infra.process import stop_group

KILL_GRACE_S = 2.0
ANSWER_GRACE_S = 1.0  # once the tests' process is done: how long the answer's may take to exit
VERDICT_BYTES = 64_000


def _ended(returncode: int | None, cpu_s: int, stderr: str) -> str:
    """Why a process went away before the tests finished, from its exit status (None: it closed
    its end of the connection but had not exited)."""
    if returncode is None:
        return "stopped answering before the tests finished (closed its connection, did not exit)"
    if returncode < 0:
        name = signal.Signals(-returncode).name if -returncode in signal.valid_signals() else str(-returncode)
        if -returncode in (signal.SIGXCPU, signal.SIGKILL):
            return f"cpu limit: killed by {name} (limit {cpu_s} s of CPU)"
        return f"killed by {name}"
    if returncode == 0:
        return "exited before the tests finished (exit status 0)"
    last = stderr.strip().splitlines()[-1:] or [""]
    return f"crashed: exit status {returncode} {last[0]}".strip()


@dataclass(frozen=True)
class _Ending:
    """How one run ended, as the parent saw it."""

    timed_out: bool
    report: dict  # the tests' process's report, {} unless it carries the run's secret
    judge_status: int | None
    answer_status: int | None  # None: still running when the parent killed it


def _classify(ending: _Ending, timeout_s: float, cpu_s: int, memory_mb: int, answer_stderr: str,
              judge_stderr: str) -> tuple[bool, str]:
    report = ending.report
    if ending.timed_out:
        return False, f"timeout: no result within {timeout_s:g} s wall clock; process groups killed"
    if ending.judge_status == 0 and report.get("passed") is True:
        return True, "passed"
    if "error" in report:
        error, message, line = report["error"], report.get("message", ""), report.get("line", "")
        if error == "MemoryError":
            return False, f"memory limit: MemoryError under a {memory_mb} MiB address-space limit"
        if error == "AssertionError" and report.get("stage") == "tests.py":
            return False, f"assertion failed: {line or message}".strip()
        detail = f": {message}" if message else ""
        return False, f"error in {report.get('stage', '?')}: {error}{detail}"
    if "broken" in report:
        if report["broken"] != "closed":
            return False, f"broke its connection to the tests: {report['broken']}"
        return False, _ended(ending.answer_status, cpu_s, answer_stderr)
    return False, f"the tests' process: {_ended(ending.judge_status, cpu_s, judge_stderr)}"


def _spawn(layers: Isolation, fds: tuple[int, ...], workdir: Path, stdout: Any, stderr: Any,
           confine: Callable[[], None]) -> subprocess.Popen:
    """One of a run's two processes: `python -I -c _BOOT fd...`, its program and input on stdin."""
    env = {
        "PATH": "/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "HOME": str(workdir),
        "TMPDIR": SANDBOX_DIR if layers.mount_namespace else str(workdir),
    }
    return subprocess.Popen(
        [layers.interpreter, "-I", "-c", _BOOT, *map(str, fds)],
        cwd=workdir,
        env=env,
        stdin=subprocess.PIPE,
        stdout=stdout,
        stderr=stderr,
        pass_fds=fds,
        start_new_session=True,
        preexec_fn=confine,
    )


def _collect(judge: subprocess.Popen, answer: subprocess.Popen, judge_input: bytes,
             answer_input: bytes, verdict_r: int, secret: str, timeout_s: float) -> _Ending:
    """Hand both their input, read the verdict (bounded), wait for the tests' process to the
    deadline, give the answer's a moment to exit on its own, then kill both groups."""
    deadline = time.monotonic() + timeout_s
    chunks: list[bytes] = []

    def read_verdict() -> None:
        with os.fdopen(verdict_r, "rb") as verdict:
            while sum(map(len, chunks)) < VERDICT_BYTES and (chunk := verdict.read(4096)):
                chunks.append(chunk)

    reader = threading.Thread(target=read_verdict, daemon=True)
    reader.start()
    for process, given in ((judge, judge_input), (answer, answer_input)):
        try:
            if process.stdin is not None:
                process.stdin.write(given)
                process.stdin.close()
        except OSError:
            pass  # it died before reading: its exit status tells why
    timed_out = False
    try:
        judge.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
    if not timed_out:
        try:
            answer.wait(timeout=max(0.0, min(ANSWER_GRACE_S, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            pass
    answer_status = answer.returncode
    _kill_group(judge)
    _kill_group(answer)
    reader.join(timeout=KILL_GRACE_S)
    try:
        report = ast.literal_eval(b"".join(chunks)[:VERDICT_BYTES].decode(errors="replace") or "{}")
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        report = {}
    if not isinstance(report, dict) or report.get("secret") != secret:
        report = {}  # not the tests' process's: whatever wrote it is not heard
    return _Ending(timed_out, report, judge.returncode, answer_status)


def _kill_group(process: subprocess.Popen) -> None:
    try:
        stop_group(process, signal.SIGKILL, KILL_GRACE_S)
        process.wait(timeout=KILL_GRACE_S)  # a leader that left its group: killpg did not reach it
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
