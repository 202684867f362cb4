"""SIGTERM to a test session (a CI runner stopping the end-to-end tier) leaves no process behind.

A child `pytest` runs a tiny module with this suite's conftest: the session fixture `prefect_api`
starts a real Prefect server (in its own process session), and the test starts what `quantgate
run` does, a child that starts an engine in a session of its own. Once the server answers, the
child pytest alone gets SIGTERM; every process its tree had must be gone.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).parents[1]
# Bounds on the waits, generous for a loaded 2-core box; none is a measurement.
START_WAIT_S = 120
EXIT_WAIT_S = 60
GONE_WAIT_S = 30

MODULE = '''
import subprocess, sys, time
from pathlib import Path

import pytest

HERE = Path(__file__).parent
ENGINE = ("import subprocess, sys, time; "
          "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], "
          "start_new_session=True); "
          "open(sys.argv[1], 'w').write(str(p.pid)); time.sleep(600)")


@pytest.fixture(scope="session")
def torn_down():
    yield
    (HERE / "torn-down").write_text("the session's fixtures were torn down")


def test_holds_a_server_and_an_engine(prefect_api, torn_down):
    (HERE / "api").write_text(prefect_api)
    # As `quantgate run` under test: its engine sits in a process session of its own.
    subprocess.run([sys.executable, "-c", ENGINE, str(HERE / "engine.pid")], timeout=600)
'''


def _tree(pid: int) -> list[psutil.Process]:
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def _alive(processes: list[psutil.Process]) -> list[psutil.Process]:
    _, alive = psutil.wait_procs(processes, timeout=GONE_WAIT_S)
    return [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]


def test_sigterm_to_a_test_session_stops_its_servers_and_engines(tmp_path):
    (tmp_path / "test_tiny.py").write_text(textwrap.dedent(MODULE))
    env = os.environ | {"PYTHONPATH": str(ROOT), "PREFECT_HOME": str(tmp_path / "prefect-home")}
    env.pop("PYTEST_XDIST_WORKER", None)
    log = (tmp_path / "pytest.log").open("wb")
    child = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "no:cacheprovider",
         "-o", "addopts=", "--rootdir", str(tmp_path), str(tmp_path / "test_tiny.py")],
        cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    recorded: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + START_WAIT_S
        while child.poll() is None and time.monotonic() < deadline and not (
                (tmp_path / "api").is_file() and (tmp_path / "engine.pid").is_file()):
            time.sleep(0.2)
        output = (tmp_path / "pytest.log").read_text(errors="replace")
        assert child.poll() is None and (tmp_path / "engine.pid").is_file(), output
        api = (tmp_path / "api").read_text()
        assert httpx.get(f"{api}/health", timeout=10).status_code == 200
        recorded = _tree(child.pid)
        engine = int((tmp_path / "engine.pid").read_text())
        assert engine in {p.pid for p in recorded}
        assert any("prefect" in " ".join(p.cmdline()) for p in recorded[1:]), recorded

        child.send_signal(signal.SIGTERM)  # the pytest process only, not its group
        code = child.wait(EXIT_WAIT_S)
        output = (tmp_path / "pytest.log").read_text(errors="replace")
        assert code == 2, output  # pytest's "interrupted", not killed by the signal (-15)
        assert (tmp_path / "torn-down").is_file(), output
        assert _alive(recorded) == [], output
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait(EXIT_WAIT_S)
        for process in recorded:  # a failing run must not leave them either
            with contextlib.suppress(psutil.Error):
                process.kill()
        log.close()
