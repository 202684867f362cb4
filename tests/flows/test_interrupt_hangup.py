"""A hang-up (the terminal closed, the ssh session dropped) during `quantgate run` stops its
engines as Ctrl-C does: they run in sessions of their own, so the hang-up never reaches them.
Under `nohup` the run keeps going, as asked.

The child is the interrupt handling as `run` installs it, with a child in a session of its own
(as the engine is) standing in for the flow.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil

from tests.flows.test_interrupt import _alive, _interrupt_when

ROOT = Path(__file__).parents[2]

SCRIPT = """
import signal, subprocess, sys, time
sys.path.insert(0, {root!r})
# As `nohup` leaves it, or as a terminal's shell starts a command: a suite run under nohup
# (a CI job, say) hands its children SIGHUP ignored, and the run rightly keeps ignoring it.
signal.signal(signal.SIGHUP, signal.SIG_IGN if {nohup!r} else signal.SIG_DFL)
from flows import interrupt
interrupt.install(lambda: "kept nothing")
engine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                          start_new_session=True, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)  # logs to a file, as the engine does
print("ready", flush=True)
time.sleep(600)
"""


def _start(tmp_path: Path, nohup: bool) -> tuple[subprocess.Popen, list]:
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent(SCRIPT.format(root=str(ROOT), nohup=nohup)))
    process = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, start_new_session=True, text=True)
    assert process.stdout.readline() == "ready\n"
    return process, psutil.Process(process.pid).children(recursive=True)


def test_a_hang_up_stops_the_engine_and_exits_130(tmp_path):
    process, children = _start(tmp_path, nohup=False)
    try:
        code, _, _ = _interrupt_when(process, lambda: True, signal.SIGHUP)
        rest = process.stdout.read()
        assert code == 130, rest
        assert [line for line in rest.splitlines() if line.strip()] == [
            "interrupted by SIGHUP: kept nothing"]
        assert children and _alive(children) == []
    finally:
        for child in children:  # without the handling the engine outlives the run
            if child.is_running():
                child.kill()


def test_under_nohup_a_hang_up_does_not_stop_the_run(tmp_path):
    process, children = _start(tmp_path, nohup=True)
    try:
        process.send_signal(signal.SIGHUP)
        # Pending together, handlers run in signal order: a handled SIGHUP would be named.
        code, _, _ = _interrupt_when(process, lambda: True, signal.SIGTERM)
        rest = process.stdout.read()
        assert code == 130, rest
        assert [line for line in rest.splitlines() if line.strip()] == [
            "interrupted by SIGTERM: kept nothing"]
        assert _alive(children) == []
    finally:
        for child in children:
            if child.is_running():
                child.kill()
