"""Start Locust as subprocesses: one headless process, or a master with N workers on this host."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from infra.cores import CorePlan, format_cores
from infra.errors import MeasurementError
from infra.ports import free_port
from infra.process import LoggedProcess, log_tail, stop_group
from load.locust_config import LocustConfig
from load.profile import LoadProfile

LOCUSTFILE = Path(__file__).parent / "locustfile.py"
STARTUP_ALLOWANCE_S = 60
WORKER_CONNECT_WAIT_S = 60
POLL_S = 0.5
TAIL_LINES = 30  # of a Locust log, in an error


def locust_env(
    model: str,
    profile: LoadProfile,
    tag: str,
    samples_path: Path | None,
    users: int,
    *,
    max_requests: int = 0,
    rate: float = 0.0,
    arrivals_s: float = 0.0,
    request_body: dict | None = None,
    salt: str = "",
) -> dict[str, str]:
    """The QG_* variables the locustfile reads (load/locust_config.py); `request_body`: fields
    every request adds (a structured_output stage's response_format); `salt`: prompt streams of
    its own (a paired stage's, see load/paired.py)."""
    if profile.prompts.source != "random" and profile.prompt_ids is None:
        # Never fall back to random prompts silently: the record would name the wrong source.
        raise MeasurementError(f"load profile prompts ({profile.prompts.source}) were not "
                               "tokenized for the served model: bind them first (load.prompts.bind)")
    return LocustConfig(
        model=model, prompt_tokens=profile.prompt_tokens, output_tokens=profile.output_tokens,
        seed=profile.seed, level=tag, prompt_salt=salt, timeout_s=profile.request_timeout_s,
        samples_file=str(samples_path) if samples_path else "", max_requests=max_requests,
        rate=rate, arrivals_for_s=arrivals_s, total_users=users, request_body=request_body or {},
        prompts_file=str(profile.prompt_ids or ""),
    ).to_env()


def headless_command(
    base_url: str, users: int, run_s: int, stop_timeout_s: int, out_dir: Path, tag: str,
    html: bool = True,
) -> list[str]:
    """`html`: write Locust's own HTML report (about 1 MB each, all of it logged to MLflow with
    the stage): one per level is enough to look at, the raw samples keep every request."""
    return [
        sys.executable, "-m", "locust",
        "-f", str(LOCUSTFILE),
        "--headless", "--only-summary",
        "-u", str(users), "-r", str(users),
        "-t", f"{run_s}s",
        "--stop-timeout", str(stop_timeout_s),
        "--host", base_url.rstrip("/"),
        "--csv", str(out_dir / f"locust_{tag}"),
        *(["--html", str(out_dir / f"locust_{tag}.html")] if html else []),
        # Failed requests are data for the gates, not a reason for a non-zero exit.
        "--exit-code-on-error", "0",
    ]  # fmt: skip


def worker_command(base_url: str, master_port: int) -> list[str]:
    """One worker; on another machine use the master's address instead of 127.0.0.1."""
    return [
        sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--worker",
        "--master-host", "127.0.0.1", "--master-port", str(master_port),
        "--host", base_url.rstrip("/"),
    ]  # fmt: skip


def run_locust(
    base_url: str,
    env: dict[str, str],
    users: int,
    run_s: int,
    stop_timeout_s: int,
    out_dir: Path,
    tag: str,
    workers: int = 0,
    cores: CorePlan | None = None,
    stop_when: Callable[[], bool] | None = None,
    html: bool = True,
) -> Path:
    """Run Locust to completion (local, or master + `workers` workers); returns the master log.

    With a core plan, every Locust process runs on the plan's client cores only. `stop_when`,
    asked twice a second, ends the run early when it says so (the samples written so far stay).
    """
    pin = cores.pin if cores is not None else list
    out_dir.mkdir(parents=True, exist_ok=True)
    log_path = out_dir / f"locust_{tag}.log"
    command = headless_command(base_url, users, run_s, stop_timeout_s, out_dir, tag, html)
    what = f"locust ({tag}, {users} users{f', {workers} workers' if workers else ''})"
    timeout_s = run_s + stop_timeout_s + STARTUP_ALLOWANCE_S
    worker_processes: list[subprocess.Popen] = []
    if workers:
        port = free_port()
        # The master ends the run itself, gracefully; -t stays on as a safety net only.
        env = env | replace(LocustConfig.from_env(env), master_run_s=run_s).to_env()
        safety_s = run_s + stop_timeout_s + 30
        command[command.index("-t") + 1] = f"{safety_s}s"
        timeout_s += stop_timeout_s + 30
        command += [
            "--master", "--expect-workers", str(workers),
            "--expect-workers-max-wait", str(WORKER_CONNECT_WAIT_S),
            "--master-bind-host", "127.0.0.1", "--master-bind-port", str(port),
        ]  # fmt: skip
        timeout_s += WORKER_CONNECT_WAIT_S
    full_env = os.environ | env
    try:
        on_cores = (f" (on cores {format_cores(cores.client)})"
                    if cores is not None and cores.pins_client else "")
        log_path.write_text(f"$ {' '.join(command)}{on_cores}\n", encoding="utf-8")
        master = _spawn(pin(command), log_path, full_env)
        for index in range(workers):
            worker_log = out_dir / f"locust_{tag}_worker{index}.log"
            worker_log.write_text("", encoding="utf-8")
            worker_processes.append(_spawn(pin(worker_command(base_url, port)), worker_log, full_env))
        try:
            code = _wait(master, timeout_s, stop_when)
        except subprocess.TimeoutExpired as exc:
            stop_process(master, grace_s=0)
            raise MeasurementError(
                f"{what} ran past {timeout_s}s; log {log_path}:\n{log_tail(log_path, TAIL_LINES)}"
            ) from exc
        except BaseException:  # interrupted (Ctrl-C, SIGTERM as SystemExit): no orphans
            stop_process(master, grace_s=0)
            raise
    finally:
        # The master only ends after every worker reported its users stopped (their samples
        # arrived before that report), so whatever workers still do is no longer needed.
        for worker in worker_processes:
            stop_process(worker, grace_s=2)
    if code != 0:
        raise MeasurementError(
            f"{what} exited with {code}; log {log_path}:\n{log_tail(log_path, TAIL_LINES)}")
    return log_path


def _wait(master: subprocess.Popen, timeout_s: float, stop_when: Callable[[], bool] | None) -> int:
    """The master's exit code; 0 when `stop_when` ended the run (it was stopped on purpose)."""
    if stop_when is None:
        return master.wait(timeout=timeout_s)
    deadline = time.monotonic() + timeout_s
    while master.poll() is None:
        if time.monotonic() > deadline:
            raise subprocess.TimeoutExpired(master.args, timeout_s)
        if stop_when():
            stop_process(master, grace_s=0)
            return 0
        time.sleep(POLL_S)
    return master.returncode


def _spawn(command: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    """A Locust process writing after what `log` holds. Own process group: a stop reaches
    gevent's helpers too, and never this process."""
    return LoggedProcess(command, log, append=True, env=env)


def stop_process(process: subprocess.Popen, grace_s: float = 10) -> None:
    """Wait a little (workers quit on their own after the master), then TERM, then KILL."""
    deadline = time.monotonic() + grace_s
    while process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    if process.poll() is None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            stop_group(process, grace_s=10)

