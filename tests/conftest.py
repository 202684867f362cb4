"""Shared fixtures: an in-tree OpenAI-compatible fake server for plumbing tests; SIGTERM to a
test session ends it as Ctrl-C does, leaving no process of it behind."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator

import pytest

from tests.fake_openai import FakeOpenAI


def pytest_configure(config) -> None:
    """One stage cache per test session: the end-to-end modules share what they measured (the
    baseline is served once for all of them), as a team's runs share it on one host."""
    if "QG_CACHE_DIR" not in os.environ:  # removed at the end (pytest_unconfigure): 33 MB a run
        os.environ["QG_CACHE_DIR"] = _OWN_CACHE[0] = tempfile.mkdtemp(prefix="qg-stage-cache-")
    # pytest-xdist hands its workers the terminal's width as COLUMNS; the CLI tests give the width
    # they need themselves, so workers read the CLI's output as a single process does.
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ.pop("COLUMNS", None)
    # A Prefect temporary server that an earlier test in the same process started logs its stop
    # to a stream that test's capture has closed; logging would print that error into whichever
    # test's output is being captured then.
    logging.raiseExceptions = False
    with contextlib.suppress(ValueError):  # not the main thread: the signal is not ours to take
        if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
            signal.signal(signal.SIGTERM, _on_sigterm)


# The stage cache this process made (not one a caller or the xdist controller handed down).
_OWN_CACHE: list[str | None] = [None]
# The session's processes when SIGTERM came: servers started in their own process session (a
# session fixture's Prefect server, the engines a `quantgate run` under test starts) survive the
# default SIGTERM, which kills pytest before any fixture is torn down.
_TERMINATED: list = []
_SESSION_PID = os.getpid()
STOP_GRACE_S = 15.0  # a process's own exit after SIGTERM (vLLM's is the slowest), then SIGKILL


def _on_sigterm(signum: int, frame: object) -> None:
    """End the session as Ctrl-C does: KeyboardInterrupt, so pytest tears every fixture down
    (each server stops in its context manager); pytest_unconfigure then stops what is left."""
    import psutil

    if os.getpid() != _SESSION_PID:  # a child forked with the handler (a pool's worker): die
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    if _TERMINATED:
        return  # already stopping: a second SIGTERM must not cut the teardown short
    with contextlib.suppress(psutil.Error):
        _TERMINATED.extend(psutil.Process().children(recursive=True))
    _TERMINATED.append(None)  # marks the signal even when there were no children
    raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")


def pytest_unconfigure(config) -> None:
    """After SIGTERM, every process the session had started is stopped: those the fixtures'
    teardown left (a child a test killed leaves its own children to init), SIGTERM then SIGKILL."""
    from infra.process import stop_processes

    stop_processes([process for process in _TERMINATED if process is not None], STOP_GRACE_S)
    if _OWN_CACHE[0] is not None:
        shutil.rmtree(_OWN_CACHE[0], ignore_errors=True)


@pytest.fixture(scope="session")
def prefect_api(tmp_path_factory) -> Iterator[str]:
    """One Prefect server for the end-to-end runs that are not about Prefect's own start-up: each
    `quantgate run` would otherwise start a temporary server of its own and wait for it (8 s). The
    acceptance tree keeps the temporary server, as `make demo` runs."""
    from infra.servers import PrefectServer

    with PrefectServer(tmp_path_factory.mktemp("prefect")) as server:
        yield server.api_url


@pytest.fixture
def fake_openai() -> Iterator[FakeOpenAI]:
    """A running fake server with small per-token delays; tweak its attributes before use."""
    with FakeOpenAI(token_delay_s=0.002, first_token_delay_s=0.01) as server:
        yield server
