"""Ctrl-C (or SIGTERM) during `quantgate run`: unwind, stop every child, exit in bounded time.

The first signal raises KeyboardInterrupt in the main thread, so the flow unwinds as written:
engines stop in their context managers, measured stages are already in the stage cache. From
that moment the libraries' own reactions (lm-eval's retry lines, Prefect's "crash detected",
click's "Aborted!", threads' tracebacks) are muted; what the user reads is one line. A watchdog
ends the process after `GRACE_S` even when a library thread would keep it alive, stopping the
processes it started (SIGTERM, then SIGKILL): at most GRACE_S + 2 * KILL_S = 13 s in all.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable

GRACE_S = 7.0  # for the unwinding (engines stop with SIGTERM, MLflow and Prefect record the end)
KILL_S = 3.0  # for the children's own exit after SIGTERM


class _State:
    signum: int | None = None
    saved_stderr: int | None = None
    finish_lock = threading.Lock()
    describe: Callable[[], str] = staticmethod(lambda: "")


def interrupted() -> int | None:
    """The signal that interrupted this process, if one did."""
    return _State.signum


def install(describe: Callable[[], str]) -> None:
    """Handle SIGINT and SIGTERM from now on; `describe()` says what was kept (the last line)."""
    _State.describe = staticmethod(describe)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _on_signal)


def _on_signal(signum: int, frame: object) -> None:
    if _State.signum is not None:
        return  # a second Ctrl-C while stopping: the watchdog already bounds the wait
    _State.signum = signum
    _mute()
    threading.Thread(target=_watchdog, name="quantgate-interrupt", daemon=True).start()
    raise KeyboardInterrupt


def _mute() -> None:
    """Keep the terminal for our one line: logging off, Python's and C's stderr to /dev/null."""
    logging.disable(logging.CRITICAL)
    with contextlib.suppress(OSError, ValueError, AttributeError):
        sys.stderr.flush()
        sys.stdout.flush()
    null = os.open(os.devnull, os.O_WRONLY)
    with contextlib.suppress(OSError):
        _State.saved_stderr = os.dup(2)
        os.dup2(null, 2)
    devnull = open(os.devnull, "w")  # noqa: SIM115 - lives until the process ends
    sys.stderr = devnull
    threading.excepthook = lambda args: None


def _watchdog() -> None:
    time.sleep(GRACE_S)
    finish()


def _stop_children() -> None:
    import psutil

    try:
        children = psutil.Process().children(recursive=True)
    except psutil.Error:
        return
    for child in children:
        with contextlib.suppress(psutil.Error):
            child.terminate()
    _, alive = psutil.wait_procs(children, timeout=KILL_S)
    for child in alive:
        with contextlib.suppress(psutil.Error):
            child.kill()
    psutil.wait_procs(alive, timeout=KILL_S)


def finish() -> None:
    """Stop what is left, say what was kept, and end the process now (128 + the signal)."""
    with _State.finish_lock:
        signum = _State.signum or signal.SIGINT
        with contextlib.suppress(Exception):
            _stop_children()
        name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
        line = f"interrupted by {name}: {_State.describe()}\n"
        with contextlib.suppress(OSError, ValueError, AttributeError):
            sys.stdout.flush()
        target = _State.saved_stderr if _State.saved_stderr is not None else 2
        with contextlib.suppress(OSError):
            os.write(target, line.encode())
        os._exit(128 + signum)
