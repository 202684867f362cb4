"""Shared fixtures: an in-tree OpenAI-compatible fake server for plumbing tests."""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Iterator

import pytest

from tests.fake_openai import FakeOpenAI


def pytest_configure(config) -> None:
    """One stage cache per test session: the end-to-end modules share what they measured (the
    baseline is served once for all of them), as a team's runs share it on one host."""
    os.environ.setdefault("QG_CACHE_DIR", tempfile.mkdtemp(prefix="qg-stage-cache-"))
    # pytest-xdist hands its workers the terminal's width as COLUMNS; the CLI tests give the width
    # they need themselves, so workers read the CLI's output as a single process does.
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ.pop("COLUMNS", None)
    # A Prefect temporary server that an earlier test in the same process started logs its stop
    # to a stream that test's capture has closed; logging would print that error into whichever
    # test's output is being captured then.
    logging.raiseExceptions = False


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
