"""A process quantgate starts and stops: output to a log file, its own process group, a wait for
readiness that fails with the log's tail, a stop that escalates from SIGTERM to SIGKILL."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

DIED = "exited with code {code} (log {log}):\n{tail}"
NOT_READY = "not ready after {timeout:g} s (log {log}):\n{tail}"


def log_tail(path: Path, lines: int = 15, missing: str = "(no log)") -> str:
    """The last `lines` lines of a log file, or `missing` where it cannot be read."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return missing
    return "\n".join(text.splitlines()[-lines:])


def _signal_group(process: subprocess.Popen, sig: int) -> bool:
    """Signal `process`'s group; False when no process of it is left."""
    try:
        os.killpg(process.pid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # a member we may not signal (another uid): the wait below still bounds the stop
    return True


def _group_gone(process: subprocess.Popen, timeout_s: float) -> bool:
    """Whether no live process of `process`'s group is left within `timeout_s` (its leader's
    exit says nothing of the members it left: a killed vLLM API server's engine-core process).
    Zombies count as gone: init reaps them, not us."""
    import psutil

    def members() -> bool:
        for member in psutil.process_iter(["status"]):
            with contextlib.suppress(OSError, psutil.Error):
                if (member.info["status"] != psutil.STATUS_ZOMBIE
                        and os.getpgid(member.pid) == process.pid):
                    return True
        return False

    deadline = time.monotonic() + timeout_s
    while members():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def stop_group(process: subprocess.Popen | None, sig: int = signal.SIGTERM, grace_s: float = 20.0,
               kill_wait_s: float | None = None) -> None:
    """Signal the process group (the process and what it spawned) with `sig`; SIGKILL the group
    when its leader has not exited after `grace_s`, then wait `kill_wait_s` (default `grace_s`)
    more, raising subprocess.TimeoutExpired past that.

    The group is signalled even when its leader has exited: `mlflow server` can die and leave its
    uvicorn child holding the port, a vLLM API server killed from outside its engine-core
    process; the members are then given `grace_s` to exit before SIGKILL. `sig` SIGKILL kills at
    once.
    """
    if process is None:
        return
    leader_gone = process.poll() is not None
    if sig != signal.SIGKILL:
        if not _signal_group(process, sig):
            return
        try:
            process.wait(timeout=grace_s)
            if not leader_gone or _group_gone(process, grace_s):
                return
        except subprocess.TimeoutExpired:
            pass
    if _signal_group(process, signal.SIGKILL):
        process.wait(timeout=grace_s if kill_wait_s is None else kill_wait_s)


def wait_gone(processes: list, timeout_s: float) -> list:
    """Wait up to `timeout_s` until each psutil process has exited; those still running. A
    zombie has exited: its parent reaps it, not us (psutil's wait_procs waits out a zombie that
    is not our child, such as a flow run its Prefect worker has not reaped yet)."""
    import psutil

    def running(process) -> bool:
        try:
            return process.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    deadline = time.monotonic() + timeout_s
    while True:
        alive = [process for process in processes if running(process)]
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.1)


def stop_processes(processes: list, grace_s: float) -> None:
    """SIGTERM each psutil process, SIGKILL those still alive after `grace_s`, wait as long again."""
    import psutil

    for process in processes:
        with contextlib.suppress(psutil.Error):
            process.terminate()
    alive = wait_gone(processes, grace_s)
    for process in alive:
        with contextlib.suppress(psutil.Error):
            process.kill()
    wait_gone(alive, grace_s)


class LoggedProcess(subprocess.Popen):
    """A command with stdout and stderr to `log` (a file, never a PIPE: a chatty server stalls on
    a pipe nobody reads), in a session and process group of its own unless `own_group` is False.
    `append` keeps what the log holds already; the rest goes to subprocess.Popen."""

    def __init__(self, command: list[str], log: Path, *, append: bool = False,
                 own_group: bool = True, tail_lines: int = 15, **popen) -> None:
        self.log = Path(log)
        self.tail_lines = tail_lines
        with self.log.open("a" if append else "w", encoding="utf-8") as out:
            super().__init__(command, stdout=out, stderr=subprocess.STDOUT,
                             start_new_session=own_group, **popen)

    def alive(self) -> bool:
        return self.poll() is None

    def wait_ready(self, ready: Callable[[], bool], timeout_s: float,
                   error: Callable[[str], BaseException], *, died: str = DIED,
                   not_ready: str = NOT_READY, poll_s: float = 0.25,
                   since: float | None = None) -> None:
        """Ask `ready` every `poll_s` until it says yes, for `timeout_s` from `since` (default
        now). Raises `error(message)` when the process exits first or the time runs out; the
        messages `died` and `not_ready` may name {code}, {timeout}, {log} and {tail} (its log's
        last `tail_lines` lines)."""
        deadline = (time.monotonic() if since is None else since) + timeout_s
        while time.monotonic() < deadline:
            code = self.poll()
            if code is not None:
                raise error(self._message(died, code, timeout_s))
            if ready():
                return
            time.sleep(poll_s)
        raise error(self._message(not_ready, None, timeout_s))

    def _message(self, template: str, code: int | None, timeout_s: float) -> str:
        return template.format(code=code, timeout=timeout_s, log=self.log,
                               tail=log_tail(self.log, self.tail_lines))

    def stop(self, sig: int = signal.SIGTERM, grace_s: float = 20.0) -> None:
        """stop_group on this process."""
        stop_group(self, sig, grace_s)
