"""Locust's web UI on a stage's server for a live look: `python -m load.webui --base-url URL --model M`.

The UI binds to 127.0.0.1 only. Its samples still go to a JSON-lines file (printed at start),
so a look at a stage leaves raw data behind like a measured run.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import urllib.request
from pathlib import Path

from infra.errors import MeasurementError
from infra.ports import free_port
from infra.process import LoggedProcess
from infra.secrets import redact
from load.launch import LOCUSTFILE, TAIL_LINES, locust_env, stop_process
from load.profile import load_profile

STARTUP_TIMEOUT_S = 60


class WebUI:
    """A Locust process serving its web UI; a context manager that stops it on exit."""

    def __init__(
        self,
        base_url: str,
        model: str,
        profile: str | Path,
        out_dir: Path,
        level: str = "high",
        port: int | None = None,
    ) -> None:
        self.profile = load_profile(profile)
        levels = self.profile.levels()
        if level not in levels:
            raise MeasurementError(f"unknown level {level!r}; valid: {', '.join(levels)}")
        self.base_url, self.model, self.level = base_url.rstrip("/"), model, level
        self.users = levels[level]
        self.out_dir = out_dir
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.samples_path = out_dir / f"samples_webui_{level}.jsonl"
        self.log_path = out_dir / "locust_webui.log"
        self.process: LoggedProcess | None = None

    def command(self) -> list[str]:
        # -u/-r only pre-fill the form: nothing runs until someone presses Start.
        return [
            sys.executable, "-m", "locust", "-f", str(LOCUSTFILE),
            "--web-host", "127.0.0.1", "--web-port", str(self.port),
            "--host", self.base_url, "-u", str(self.users), "-r", str(self.users),
            "--stop-timeout", str(int(self.profile.request_timeout_s)),
            "--html", str(self.out_dir / "locust_webui.html"),
        ]  # fmt: skip

    def start(self) -> WebUI:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        env = os.environ | locust_env(
            self.model, self.profile, f"webui-{self.level}", self.samples_path, self.users
        )
        self.process = LoggedProcess(self.command(), self.log_path, env=env, tail_lines=TAIL_LINES)
        try:
            self.process.wait_ready(
                self._serving, STARTUP_TIMEOUT_S, MeasurementError, poll_s=0.3,
                died="locust web UI exited with {code}; log {log}:\n{tail}",
                not_ready=f"locust web UI not up at {self.url} after {{timeout}}s")
        except MeasurementError:
            self.stop()
            raise
        return self

    def _serving(self) -> bool:
        try:
            with urllib.request.urlopen(self.url, timeout=2) as answer:
                return answer.status == 200
        except OSError:
            return False

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None:
            stop_process(process, grace_s=0)

    def __enter__(self) -> WebUI:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def open_webui(
    base_url: str,
    model: str,
    profile: str | Path = "demo",
    out_dir: Path = Path("runs/webui"),
    level: str = "high",
    port: int | None = None,
) -> None:
    """Start the web UI, print its URL and keep it up until Ctrl-C (the CLI's entry point)."""
    with WebUI(base_url, model, profile, out_dir, level, port) as ui:
        # A base URL may carry a user and password (http://u:pw@host): never print them.
        print(f"Locust web UI for {redact(base_url)} ({model}, {level}: {ui.users} users): "
              f"{ui.url}")
        print(f"raw samples: {ui.samples_path}; Ctrl-C to stop", flush=True)
        try:
            while ui.process is not None and ui.process.poll() is None:
                time.sleep(0.5)
        except KeyboardInterrupt:
            pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Locust web UI on a running server (127.0.0.1).")
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--model", required=True, help="Served model name.")
    parser.add_argument("--profile", default="demo", help="Profile name or YAML path.")
    parser.add_argument("--level", default="high", help="Which level pre-fills the user count.")
    parser.add_argument("--port", type=int, default=None, help="Web UI port (default: a free one).")
    parser.add_argument("--out", type=Path, default=Path("runs/webui"))
    args = parser.parse_args(argv)
    open_webui(args.base_url, args.model, args.profile, args.out, args.level, args.port)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
