"""Ctrl-C during `quantgate run`: exit 130, one line saying what was kept, no process left behind.

The run is real down to the engine: the CLI in its own process, Prefect's temporary server,
MLflow, lm-eval; the engine is an external one, a fake whose chat route never answers, so the
interrupt lands where a run spends its time (waiting on the engine) and no vLLM starts.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest
import yaml

from tests.evalsets.chat_fake import FakeChat, _ChatHandler
from tests.flows.test_bad_inputs import base_spec
from tests.infra.test_cpu_support import AVX512

ROOT = Path(__file__).parents[2]
# Generous bounds on the waits, not measurements: the promise is 15 s after the signal.
START_WAIT_S = 300
EXIT_WAIT_S = 60


class _Hanging(_ChatHandler):
    def do_POST(self) -> None:
        if self.path != "/v1/chat/completions":
            super().do_POST()
            return
        fake = self.server_state
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
        with fake._lock:
            fake.requests.append(body)
        fake.release.wait(EXIT_WAIT_S * 2)


class HangingChat(FakeChat):
    """An engine that takes every chat request and never answers it."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    @staticmethod
    def handler() -> type:
        return _Hanging


def _env(tmp_path: Path) -> dict[str, str]:
    return os.environ | {
        "PYTHONPATH": str(ROOT), "QG_RESULTS_DIR": str(tmp_path / "results"),
        "QG_REPORTS_DIR": str(tmp_path / "reports"), "QG_CACHE_DIR": str(tmp_path / "cache"),
        "QG_STATE_DIR": str(tmp_path / "state"),
        "QG_MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db",
        "PREFECT_HOME": str(tmp_path / "prefect"), "COLUMNS": "200"}


def _interrupt_when(process: subprocess.Popen, ready, sig: int) -> tuple[int, list, float]:
    """Wait for `ready()`, signal the process group as a terminal does; (exit code, the
    processes it had started, seconds to exit)."""
    deadline = time.monotonic() + START_WAIT_S
    while not ready() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert process.poll() is None and ready(), "the run ended or never reached its engine"
    children = psutil.Process(process.pid).children(recursive=True)
    sent = time.monotonic()
    os.killpg(process.pid, sig)
    try:
        code = process.wait(EXIT_WAIT_S)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    return code, children, time.monotonic() - sent


def _alive(processes: list) -> list:
    gone, alive = psutil.wait_procs(processes, timeout=5)
    return [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]


@pytest.mark.parametrize("sig, name", [(signal.SIGINT, "Ctrl-C"), (signal.SIGTERM, "SIGTERM")],
                         ids=["ctrl-c", "sigterm"])
def test_a_signal_during_run_exits_130_in_one_line_and_leaves_no_process(tmp_path, sig, name):
    with HangingChat() as engine:
        spec = base_spec(tmp_path)
        url = engine.base_url
        spec["engine"] = {"kind": "external", "url": url}
        spec["stages"][0]["kind"] = "control"
        del spec["stages"][0]["engine_flags"]
        (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
        log = tmp_path / "out.txt"
        with log.open("wb") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "flows.cli", "run", str(tmp_path / "spec.yaml")],
                cwd=tmp_path, env=_env(tmp_path), stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True)
            before = [0]

            def waiting_on_engine() -> bool:
                before[0] = log.stat().st_size
                return bool(engine.requests)

            code, children, seconds = _interrupt_when(process, waiting_on_engine, sig)
        engine.release.set()
    after = log.read_bytes()[before[0]:].decode(errors="replace")
    # The external engine was not started by the run: no start-up time to print ("in Nones").
    running = log.read_bytes()[:before[0]].decode(errors="replace")
    assert f"stage baseline: already running at {url} (not started" in running
    lines = [line for line in after.splitlines() if line.strip()]
    assert code == 130, after
    assert children, "the run had started no process (Prefect's server): nothing was tested"
    assert _alive(children) == []
    assert len(lines) == 1 and lines[0].startswith(f"interrupted by {name}: `quantgate run"), after
    assert f"partial results under {(tmp_path / 'results').resolve()}" in lines[0]
    assert "no stage had finished" in lines[0]
    assert seconds < EXIT_WAIT_S


def test_a_library_thread_that_never_ends_does_not_keep_the_process(tmp_path):
    """The watchdog: SIGTERM while a non-daemon thread blocks and a child runs; the process
    still ends (130, as for Ctrl-C), the child is stopped, and the line is the only output after
    the signal."""
    script = tmp_path / "stuck.py"
    script.write_text(textwrap.dedent(f"""
        import subprocess, sys, threading, time
        sys.path.insert(0, {str(ROOT)!r})
        from flows import interrupt
        interrupt.install(lambda: "kept nothing")
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        threading.Thread(target=threading.Event().wait).start()  # never ends, not a daemon
        print("ready", flush=True)
        try:
            time.sleep(600)
        except KeyboardInterrupt:
            import logging
            logging.getLogger("lib").error("a library's reaction, muted")
            raise RuntimeError("a traceback nobody should read")
    """))
    process = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, start_new_session=True, text=True)
    assert process.stdout.readline() == "ready\n"
    children = psutil.Process(process.pid).children(recursive=True)
    code, _, _ = _interrupt_when(process, lambda: True, signal.SIGTERM)
    rest = process.stdout.read()
    assert code == 130, rest
    assert [line for line in rest.splitlines() if line.strip()] == [
        "interrupted by SIGTERM: kept nothing"]
    assert children and _alive(children) == []


def test_a_describer_that_fails_still_gives_the_line(tmp_path):
    """The last line is written and the exit is 130 even when saying what was kept fails."""
    script = tmp_path / "broken.py"
    script.write_text(textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(ROOT)!r})
        from flows import interrupt
        interrupt.install(lambda: 1 / 0)
        print("ready", flush=True)
        time.sleep(600)
    """))
    process = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, start_new_session=True, text=True)
    assert process.stdout.readline() == "ready\n"
    code, _, _ = _interrupt_when(process, lambda: True, signal.SIGTERM)
    rest = process.stdout.read()
    assert code == 130, rest
    assert [line for line in rest.splitlines() if line.strip()] == [
        "interrupted by SIGTERM: the run stopped; stored stages are reused when the same command "
        "runs again"]


def test_a_run_that_ends_hands_the_signals_back(tmp_path, monkeypatch):
    """`run` called in-process (a test, a notebook) leaves the caller's handlers as they were."""
    from typer.testing import CliRunner

    from flows.cli import app

    def mine(signum, frame):
        raise AssertionError("not called")

    monkeypatch.setattr("flows.preflight.cpu_flags", lambda: AVX512)
    previous = {sig: signal.signal(sig, mine) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        spec = base_spec(tmp_path) | {"load_profile": "no-such-profile"}
        (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
        result = CliRunner().invoke(app, ["run", str(tmp_path / "spec.yaml")])
        assert result.exit_code == 2, result.output
        assert signal.getsignal(signal.SIGINT) is mine
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def test_interrupted_while_the_spec_is_checked_says_nothing_was_measured(tmp_path):
    from flows.interrupt import kept_line

    line = kept_line(tmp_path / "spec.yaml", None, 0.0)
    assert line.startswith(f"`quantgate run {tmp_path / 'spec.yaml'}` stopped while its spec was "
                           "checked, before any engine started; nothing was measured")


def test_ctrl_c_outside_a_run_s_own_handling_is_one_line_and_130(monkeypatch, capsys):
    import flows.cli

    def interrupted() -> None:  # Ctrl-C while a command parses, or in one that is not `run`
        raise KeyboardInterrupt

    monkeypatch.setattr(flows.cli, "_app", interrupted)
    monkeypatch.setattr(sys, "argv", ["quantgate", "gate", "runs/x"])
    with pytest.raises(SystemExit) as ended:
        flows.cli.main()
    assert ended.value.code == 130
    err = capsys.readouterr().err
    assert err.splitlines() == ["interrupted by Ctrl-C: `quantgate gate` stopped; run it again"], err
