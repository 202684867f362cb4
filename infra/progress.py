"""Live progress of long work, as lm-eval and Locust users expect it: items done of total, a rate,
an estimate of what is left.

On a terminal it is a rich progress bar (one line per running task); elsewhere (CI, a Prefect
worker's log) plain lines at the start, every `interval_s` and at the end of each task. The
measuring code only calls `progress.task(label, total)` and the `advance` it yields; which of the
two it becomes is decided once per process (`use_terminal`).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

INTERVAL_S = 30.0  # plain mode: a line at most this often per task (and at 25 / 50 / 75 %)


def _duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


class _Plain:
    """Log lines: 'label: 12/60 items, 0.8 items/s, ~1m00s left'."""

    def __init__(self, write: Callable[[str], None], label: str, total: int | None,
                 unit: str, interval_s: float) -> None:
        self.write, self.label, self.total, self.unit = write, label, total, unit
        self.interval_s = interval_s
        self.done = 0
        self.started = self.last = time.monotonic()
        self.next_quarter = 1
        self.lock = threading.Lock()
        of = f"/{total}" if total else ""
        self.write(f"{label}: 0{of} {unit}")

    def status(self) -> str:
        elapsed = time.monotonic() - self.started
        rate = self.done / elapsed if elapsed > 0 else 0.0
        of = f"/{self.total}" if self.total else ""
        text = f"{self.label}: {self.done}{of} {self.unit}, {rate:.2f} {self.unit}/s"
        if self.total and rate > 0 and self.done < self.total:
            text += f", ~{_duration((self.total - self.done) / rate)} left"
        return text

    def advance(self, n: int = 1) -> None:
        with self.lock:
            self.done += n
            now = time.monotonic()
            quarter = self.total and self.done * 4 >= self.next_quarter * self.total
            if (quarter and self.done < self.total) or now - self.last >= self.interval_s:
                if quarter:
                    self.next_quarter = self.done * 4 // self.total + 1
                self.last = now
                self.write(self.status())

    def close(self) -> None:
        of = f"/{self.total}" if self.total else ""
        self.write(f"{self.label}: {self.done}{of} {self.unit} in "
                   f"{_duration(time.monotonic() - self.started)}")


def _to_run_log(text: str) -> None:
    """Inside a Prefect flow or task: its run log (the service's UI shows it, whether or not the
    task logs prints); elsewhere, stdout."""
    try:
        from prefect.exceptions import MissingContextError
        from prefect.logging import get_run_logger
    except ImportError:
        print(text, flush=True)
        return
    try:
        get_run_logger().info(text)
    except MissingContextError:
        print(text, flush=True)


class Reporter:
    """One per process; `task` is safe to use from several threads."""

    def __init__(self, terminal: bool | None = None, interval_s: float = INTERVAL_S,
                 write: Callable[[str], None] | None = None) -> None:
        self.terminal = sys.stderr.isatty() if terminal is None else terminal
        self.interval_s = interval_s
        self.write = write or _to_run_log
        self._bars: Progress | None = None
        self._open = 0
        self._lock = threading.Lock()

    def line(self, text: str) -> None:
        if self._bars is not None:
            self._bars.console.print(text, markup=False, highlight=False)
        else:
            self.write(text)

    @contextmanager
    def task(self, label: str, total: int | None, unit: str = "items"
             ) -> Iterator[Callable[[int], None]]:
        if not self.terminal:
            plain = _Plain(self.write, label, total, unit, self.interval_s)
            try:
                yield plain.advance
            finally:
                plain.close()
            return
        bars = self._start_bars()
        task_id = bars.add_task(label, total=total, unit=unit)
        started = time.monotonic()
        try:
            yield lambda n=1: bars.advance(task_id, n)
        finally:
            done = int(bars.tasks[bars.task_ids.index(task_id)].completed)
            bars.remove_task(task_id)
            of = f"/{total}" if total else ""
            self.line(f"{label}: {done}{of} {unit} in {_duration(time.monotonic() - started)}")
            self._stop_bars()

    def _start_bars(self) -> Progress:
        with self._lock:
            if self._bars is None:
                self._bars = Progress(
                    TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("{task.fields[unit]}"), TimeElapsedColumn(), TextColumn("eta"),
                    TimeRemainingColumn(), console=Console(stderr=True), transient=True)
                self._bars.start()
            self._open += 1
            return self._bars

    def _stop_bars(self) -> None:
        with self._lock:
            self._open -= 1
            if self._open == 0 and self._bars is not None:
                self._bars.stop()
                self._bars = None


progress = Reporter()


def use_terminal(terminal: bool) -> None:
    """Choose bars (a terminal) or plain lines for this process."""
    progress.terminal = terminal
