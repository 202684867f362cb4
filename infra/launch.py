"""An engine quantgate starts itself: a subprocess on its own port, logged to a file, polled to
health while it is alive, stopped with SIGTERM then SIGKILL. Each launched kind (vLLM, SGLang)
adds only how it reads its facts."""

from __future__ import annotations

import os
import sys
import time
from abc import abstractmethod
from pathlib import Path

from infra.checkpoint import read_config
from infra.engine import STARTED, Engine, EngineFacts
from infra.errors import EngineError, PortInUseError
from infra.placement import wait_until_free
from infra.ports import free_port, port_free
from infra.probe import healthy
from infra.process import LoggedProcess


class LaunchedEngine(Engine):
    """A server started from a stage's checkpoint with its kind's command (EngineArgs.command)."""

    stop_grace_s = 30.0

    def __init__(self, spec, checkpoint: Path, flags, log_path: Path, stage: str = "") -> None:
        if spec.port is None:  # a port per engine: runs side by side do not collide
            spec = spec.model_copy(update={"port": free_port(spec.host)})
        self.spec = spec
        self.checkpoint = checkpoint
        self.flags = flags
        self.log_path = log_path
        self.stage = stage
        self.base_url = f"http://{spec.host}:{spec.port}"
        self.process: LoggedProcess | None = None

    def start(self) -> EngineFacts:
        read_config(self.checkpoint)
        if not port_free(self.spec.host, self.spec.port):
            raise PortInUseError(
                f"port {self.spec.port} on {self.spec.host} is already in use; "
                "stop what holds it or set engine.port in the spec"
            )
        if self.spec.on_gpu() and self.spec.cuda_visible_devices:
            # The engine stopped before on these GPUs must have let go of its memory.
            wait_until_free([int(i) for i in self.spec.cuda_visible_devices.split(",")],
                            self.spec.gpu_memory_utilization)
        launched = self.launch_spec()
        command, env = launched.command(self.checkpoint, self.flags, python=sys.executable,
                                        reveal=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        STARTED.append((self.stage, self.log_path))
        started = time.monotonic()
        self.process = LoggedProcess(command, self.log_path, env=os.environ | env)
        self.process.wait_ready(
            lambda: healthy(self.base_url), self.spec.startup_timeout_s, EngineError,
            died="engine exited with code {code} during start-up (log {log}):\n{tail}",
            not_ready="engine not healthy after {timeout:g} s (log {log}):\n{tail}",
            poll_s=1.0, since=started)
        facts = self._facts(*launched.command(self.checkpoint, self.flags, python=sys.executable))
        facts.startup_s = round(time.monotonic() - started, 1)
        facts.pid = self.process.pid if self.process is not None else None
        return facts

    def launch_spec(self):
        """The settings the command is built from at launch (default: the spec's own)."""
        return self.spec

    @abstractmethod
    def _facts(self, command: list[str], env: dict[str, str]) -> EngineFacts:
        """The healthy engine's facts; `command`/`env` as recorded (credentials masked)."""

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None:  # its group too when the server itself died (infra/process.py)
            process.stop(grace_s=self.stop_grace_s)
