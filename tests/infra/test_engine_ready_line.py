"""The run log's line for an engine that answers: its start-up time when this run started it,
and for an external server that it was already running (there is no start-up time to print)."""

from __future__ import annotations

from pathlib import Path

from flows.spec import ExternalEngineSpec
from infra.engine import EngineFacts
from infra.external_engine import ExternalEngine


def test_an_external_server_is_said_to_be_running_not_healthy_in_none(fake_openai, tmp_path):
    spec = ExternalEngineSpec(kind="external", url=fake_openai.base_url)
    with ExternalEngine(spec, tmp_path / "no-checkpoint", None, Path("unused.log")) as facts:
        line = facts.ready_line()
    assert facts.startup_s is None and facts.kv_cache_tokens is None  # the fake has no /metrics
    assert line == (f"already running at {fake_openai.base_url} (not started by this run), "
                    "KV capacity not reported")
    assert "None" not in line


def test_an_engine_this_run_started_gives_its_start_up_and_kv_capacity():
    facts = EngineFacts(base_url="http://127.0.0.1:8100", model="m", startup_s=27.3,
                        kv_cache_tokens=46592)
    assert facts.ready_line() == "healthy in 27.3 s, KV 46,592 tokens"


def test_a_password_in_an_external_url_is_not_logged():
    facts = EngineFacts(base_url="http://user:hunter2-secret@10.0.0.5:8000", model="m")
    assert "hunter2-secret" not in facts.ready_line()
    assert "10.0.0.5:8000" in facts.ready_line()
