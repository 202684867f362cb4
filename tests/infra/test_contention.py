"""Other processes' CPU share over a window: a busy process outside this tree shows, our own
work does not."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from infra.contention import others_share, sample


def _spin(cpu_seconds: float) -> None:
    end = time.process_time() + cpu_seconds  # CPU, not wall: the box may be busy
    while time.process_time() < end:
        pass


def test_our_own_work_and_our_children_s_are_ours():
    start = sample()
    _spin(1.0)
    subprocess.run([sys.executable, "-c", "import time\n"
                    "while time.process_time() < 1.0: pass"], check=True)  # a reaped child
    end = sample()
    assert end.ours_s - start.ours_s >= 1.6  # both seconds of spinning, less tick rounding
    # Whatever else the box runs, our own spinning is not in the others' share.
    ours = (end.ours_s - start.ours_s) / ((end.wall_s - start.wall_s) * end.cores)
    assert others_share(start, end) <= 1 - ours + 0.05


def test_a_busy_process_outside_this_tree_shows_as_its_share_of_the_box():
    # Started through a shell that exits at once: the spinner is re-parented, not our child.
    spinner = subprocess.run(
        ["sh", "-c", f"{sys.executable} -c 'while True: pass' >/dev/null 2>&1 & echo $!"],
        capture_output=True, text=True, check=True)
    pid = int(spinner.stdout.strip())
    try:
        time.sleep(0.3)
        start = sample()
        time.sleep(2.0)
        share = others_share(start, sample())
    finally:
        os.kill(pid, signal.SIGKILL)
    cores = os.cpu_count() or 1
    assert share is not None and share >= 0.8 / cores  # one spinning core of `cores`


def test_a_window_too_short_to_read_is_none():
    start = sample()
    assert others_share(start, sample()) is None
