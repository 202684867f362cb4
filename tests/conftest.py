"""Shared fixtures: an in-tree OpenAI-compatible fake server for plumbing tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fake_openai import FakeOpenAI


@pytest.fixture
def fake_openai() -> Iterator[FakeOpenAI]:
    """A running fake server with small per-token delays; tweak its attributes before use."""
    with FakeOpenAI(token_delay_s=0.002, first_token_delay_s=0.01) as server:
        yield server
