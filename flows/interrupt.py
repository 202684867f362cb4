"""Ctrl-C (or SIGTERM) during `quantgate run`: unwind, stop every child, exit in bounded time.

The first signal raises KeyboardInterrupt in the main thread, so the flow unwinds as written:
engines stop in their context managers, measured stages are already in the stage cache. From
that moment the libraries' own reactions (lm-eval's retry lines, Prefect's "crash detected",
click's "Aborted!", threads' tracebacks) are muted; what the user reads is one line. A watchdog
ends the process after `GRACE_S` even when a library thread would keep it alive, stopping the
processes it started (SIGTERM, then SIGKILL): at most GRACE_S + 2 * KILL_S = 13 s in all.

Either signal ends the run with EXIT_CODE, 130: the run was stopped on purpose, whoever sent the
signal (a terminal's Ctrl-C, `kill`, a CI runner's SIGTERM), and what is kept is the same. So
does SIGHUP (the terminal closed, an ssh session dropped), unless the run ignores it (`nohup`):
the engines run in sessions of their own, so a hang-up that ended quantgate at once would leave
them serving.
`restore()` hands the signals back when the run ends without one (the CLI called in-process).
`kept_line` is that line for `quantgate run`: the stages it stored, its folder, how to resume.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from infra.process import stop_processes

GRACE_S = 7.0  # for the unwinding (engines stop with SIGTERM, MLflow and Prefect record the end)
KILL_S = 3.0  # for the children's own exit after SIGTERM
EXIT_CODE = 130  # 128 + SIGINT, for SIGTERM too: one code for "stopped, what was measured is kept"


class _State:
    signum: int | None = None
    pid: int | None = None  # the process that installed the handlers (a forked child is not it)
    saved_stderr: int | None = None
    previous: dict[int, object] = {}  # the handlers before install()
    prefect_bridge: Callable | None = None  # Prefect's own SIGTERM handler, while ours is in its place
    finish_lock = threading.Lock()
    describe: Callable[[], str] = staticmethod(lambda: "")


def interrupted() -> int | None:
    """The signal that interrupted this process, if one did."""
    return _State.signum


def install(describe: Callable[[], str]) -> None:
    """Handle SIGINT, SIGTERM and SIGHUP from now on; `describe()` says what was kept (the last
    line). A SIGHUP ignored already (`nohup quantgate run`) stays ignored."""
    _State.describe = staticmethod(describe)
    _State.pid = os.getpid()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        if sig == signal.SIGHUP and signal.getsignal(sig) is signal.SIG_IGN:
            continue
        previous = signal.signal(sig, _on_signal)
        if previous is not _on_signal:
            _State.previous[sig] = previous
    _claim_prefect_bridge(_on_signal)


def _claim_prefect_bridge(handler: Callable | None) -> None:
    """While a flow runs, Prefect's engine puts its own SIGTERM handler in place of ours: it
    raises TerminationSignal, logs "Crash detected!" (and lm-eval its retries) and only then
    sends the signal again to the handler it replaced. Ours takes its place (the module global
    that engine installs), so SIGTERM unwinds as Ctrl-C does, muted from the first moment.
    `None` puts Prefect's back."""
    try:
        from prefect.utilities import engine
    except ImportError:
        return
    if not hasattr(engine, "_prefect_sigterm_handler"):
        return  # another Prefect: its SIGTERM lines are not muted, the exit still bounded
    if handler is None:
        if _State.prefect_bridge is not None:
            engine._prefect_sigterm_handler, _State.prefect_bridge = _State.prefect_bridge, None
    elif engine._prefect_sigterm_handler is not handler:
        _State.prefect_bridge = engine._prefect_sigterm_handler
        engine._prefect_sigterm_handler = handler


def restore() -> None:
    """The handlers from before `install`, unless a signal came: then `finish` ends the process."""
    if _State.signum is not None:
        return
    _claim_prefect_bridge(None)
    for sig, previous in _State.previous.items():
        signal.signal(sig, previous)
    _State.previous.clear()


def _on_signal(signum: int, frame: object) -> None:
    if os.getpid() != _State.pid:  # a child forked with our handler: the signal ends it as usual
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    if _State.signum is not None:
        return  # a second Ctrl-C while stopping: the watchdog already bounds the wait
    _State.signum = signum
    _mute()
    atexit.register(finish)  # the KeyboardInterrupt may end the main thread before anyone calls it
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
    stop_processes(children, KILL_S)


def _kept() -> str:
    try:
        return _State.describe()
    except Exception:  # noqa: BLE001 - the last line must be written, whatever the describer hit
        return "the run stopped; stored stages are reused when the same command runs again"


def finish() -> None:
    """Stop what is left, say what was kept, and end the process now with EXIT_CODE."""
    with _State.finish_lock:
        signum = _State.signum or signal.SIGINT
        with contextlib.suppress(Exception):
            _stop_children()
        name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
        line = f"interrupted by {name}: {_kept()}\n"
        with contextlib.suppress(OSError, ValueError, AttributeError):
            sys.stdout.flush()
        target = _State.saved_stderr if _State.saved_stderr is not None else 2
        with contextlib.suppress(OSError):
            os.write(target, line.encode())
        os._exit(EXIT_CODE)


def kept_line(spec: Path, settings, started: float, no_cache: bool = False) -> str:
    """An interrupted `quantgate run`'s last words: what stopped, what was kept, how to resume.

    `settings` is None while the spec is still being checked; `started` (epoch seconds) tells
    this run's files from older ones."""
    command = f"quantgate run {spec}"
    if settings is None:
        return (f"`{command}` stopped while its spec was checked, before any engine started; "
                "nothing was measured; run the same command again to start")
    results = settings.results_dir.resolve()
    folder = _run_folder(results, spec, started)
    done = [] if folder is None else _stored_stages(folder, started, settings.stage_cache_dir)
    kept = (f"measured stage(s) {', '.join(done)} kept in the stage cache "
            f"{settings.stage_cache_dir}" if done else "no stage had finished")
    # --no-cache measures every stage again: resuming is the command without it.
    again = (f"run `quantgate run {spec}` (without --no-cache) to resume" if no_cache
             else "run the same command again to resume")
    return (f"`{command}` stopped and its engines with it; {kept}; partial results under "
            f"{folder or results}; {again} (stored stages are reused, not measured again)")


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}  # not written yet, or half written when the signal came


def _run_folder(results: Path, spec: Path, started: float) -> Path | None:
    """This run's results folder: the newest manifest written since `started` for this spec."""
    ours = []
    for manifest in results.glob("*/manifest.json"):
        with contextlib.suppress(OSError):
            if manifest.stat().st_mtime >= started and \
                    _read_json(manifest).get("spec_path") == str(spec):
                ours.append((manifest.stat().st_mtime, manifest.parent))
    return max(ours)[1] if ours else None


def _stored_stages(folder: Path, started: float, cache: Path) -> list[str]:
    """The stages this run measured and stored in the stage cache `cache` (a control stage or
    one that failed is not stored there; a reused one was stored before)."""
    manifest = _read_json(folder / "manifest.json")
    done = []
    for name in manifest.get("stages", []):
        path = folder / name / "stage.json"
        record = _read_json(path)
        key = record.get("cache_key")
        with contextlib.suppress(OSError):
            if (key and record.get("kind") != "control" and name not in manifest.get("reused", {})
                    and path.stat().st_mtime >= started and (cache / key).is_dir()):
                done.append(name)
    return done
