"""Locust runs on the load generator's cores of the core plan, and the load result says where."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from infra.cores import plan_cores
from load import launch
from load.profile import LoadProfile
from load.results import LoadResult
from load.runner import run_load

PROFILE = LoadProfile(
    low_users=1, high_users=2, prompt_tokens=16, output_tokens=4, warmup_s=0.5, duration_s=3,
    request_timeout_s=10, seed=3, workers=1,
)


def locust_affinity(pid: int, deadline_s: float = 20) -> set[int]:
    """The affinity of a process once it is Locust itself (past the pinning wrapper's exec)."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        if argv[1:3] == [b"-m", b"locust"]:
            return os.sched_getaffinity(pid)
        time.sleep(0.01)
    raise AssertionError(f"process {pid} never became Locust: {argv}")


def test_every_locust_process_runs_on_the_planned_client_cores(fake_openai, tmp_path, monkeypatch):
    usable = sorted(os.sched_getaffinity(0))
    if len(usable) < 2:
        pytest.fail("pinning needs two usable cores to show (this process has one)")
    # The engine bound to the last core: the load generator gets the others.
    plan = plan_cores("cpu", str(usable[-1]), usable=usable)
    seen: list[set[int]] = []
    spawn = launch._spawn

    def recording_spawn(command, log, env):
        process = spawn(command, log, env)
        seen.append(locust_affinity(process.pid))
        return process

    monkeypatch.setattr(launch, "_spawn", recording_spawn)
    result = run_load(fake_openai.base_url, "fake-model", PROFILE, tmp_path, cores=plan)

    assert len(seen) == 4  # per level: the master and its one worker
    assert all(cores == set(usable[:-1]) for cores in seen), seen
    assert usable[-1] not in set().union(*seen)
    assert result.summaries["low"].requests > 0
    assert "(on cores " in (tmp_path / "locust_low.log").read_text().splitlines()[0]
    stored = LoadResult.read(tmp_path)
    assert (stored.engine_cores, stored.cores_shared) == (str(usable[-1]), False)
    assert stored.cores_sentence().startswith("load generator on core")
    assert stored.cores_sentence().endswith(": separate cores")


def test_shared_cores_are_recorded_in_plain_words():
    result = LoadResult()
    result.record_cores(plan_cores("cpu", usable=[0, 1]))
    assert result.cores_sentence() == (
        "load generator and engine shared cores 0-1 (2 usable cores: the engine needs them all): "
        "client overhead is inside the latency figures")
    split = LoadResult()
    split.record_cores(plan_cores("cpu", usable=range(16)))
    assert split.cores_sentence() == ("load generator on cores 0-1, engine on cores 2-15 "
                                      "(16 usable cores: 2 kept for the load generator): "
                                      "separate cores")
    gpu = LoadResult()
    gpu.record_cores(plan_cores("cuda", usable=range(4)))
    assert gpu.cores_sentence() == ("load generator on cores 0-3 "
                                    "(the engine runs on the cuda device; 4 usable cores for the client)")


def test_results_stored_before_the_core_plan_still_load(tmp_path):
    (tmp_path / "load.json").write_text('{"summaries": {}, "samples": {}}')
    old = LoadResult.read(tmp_path)
    assert old.client_cores == "" and not old.cores_shared
    assert old.cores_sentence() == "where the load generator ran was not recorded"
