"""The core plan: the engine and the load generator kept apart when the box has cores to spare."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from flows.spec import EngineFlags, ExternalEngineSpec, VllmEngineSpec
from infra.cores import CorePlan, format_cores, parse_bind, plan_cores, plan_for
from infra.errors import SpecError
from infra.vllm_engine import build_command


def test_two_usable_cores_are_shared_and_say_why():
    plan = plan_cores("cpu", usable=[0, 1])
    assert plan.shared and plan.engine == plan.client == (0, 1)
    assert plan.engine_bind == "0-1"  # all cores: faster than vLLM's default (FACTS.md)
    assert plan.reason == "2 usable cores: the engine needs them all"
    assert not plan.pins_client


def test_four_usable_cores_keep_one_for_the_load_generator():
    plan = plan_cores("cpu", usable=[0, 1, 2, 3])
    assert not plan.shared
    assert (plan.client, plan.engine, plan.engine_bind) == ((0,), (1, 2, 3), "1-3")
    assert plan.pins_client


def test_sixteen_usable_cores_keep_two_and_a_restricted_affinity_is_respected():
    # e.g. taskset -c 4-19: the plan never names a core this process may not use.
    plan = plan_cores("cpu", usable=range(4, 20))
    assert (plan.client, plan.engine_bind) == ((4, 5), "6-19")
    assert plan_cores("cpu", usable=range(15)).client == (0,)


def test_an_explicit_bind_wins_and_the_client_gets_the_rest():
    plan = plan_cores("cpu", "0-3|4-7", usable=range(10))
    assert plan.engine_bind == "0-3|4-7"  # passed to vLLM as written: one list per rank
    assert plan.engine == tuple(range(8)) and plan.client == (8, 9) and not plan.shared
    # A bind that takes every usable core leaves the client nothing of its own.
    full = plan_cores("cpu", "0,1", usable=[0, 1])
    assert full.shared and full.client == (0, 1)
    assert full.reason == "engine.omp_threads_bind '0,1' takes all 2 usable cores"
    # vLLM's keywords name no cores: nobody can keep the client off the engine's.
    assert plan_cores("cpu", "auto", usable=range(8)).shared


def test_a_gpu_engine_binds_no_cpu_core():
    plan = plan_cores("cuda", usable=range(16))
    assert plan.engine == () and plan.client == tuple(range(16)) and not plan.shared
    assert plan.engine_bind is None and not plan.pins_client


def test_bind_syntax_is_vllms_and_a_bad_one_names_the_value():
    assert parse_bind("0-3") == [(0, 1, 2, 3)]
    assert parse_bind("0,2,4") == [(0, 2, 4)]
    assert parse_bind("0-1|2-3") == [(0, 1), (2, 3)]
    assert parse_bind("5,2-4") == [(2, 3, 4, 5)]
    assert parse_bind("nobind") == []
    with pytest.raises(SpecError, match=r"'0-3;4' is not a core id or a range.*'0-3\|4-7'"):
        parse_bind("0-3;4")
    with pytest.raises(SpecError, match=r"runs backwards; did you mean '1-3'"):
        parse_bind("3-1")
    assert format_cores([0, 1, 2, 3, 8, 10, 11]) == "0-3,8,10-11"
    assert format_cores([5]) == "5"


def test_build_command_binds_the_engine_to_the_planned_cores(monkeypatch):
    monkeypatch.setattr("infra.cores.usable_cores", lambda: tuple(range(8)))
    _, env = build_command(VllmEngineSpec(port=8000), Path("m"), EngineFlags(), python="python")
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "1-7"  # core 0 for the load generator
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in env
    _, env = build_command(VllmEngineSpec(port=8000, omp_threads_bind="0"), Path("m"),
                           EngineFlags(), python="python")
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "0"
    _, env = build_command(VllmEngineSpec(port=8000, device="cuda"), Path("m"), EngineFlags())
    assert "VLLM_CPU_OMP_THREADS_BIND" not in env and "VLLM_ENABLE_V1_MULTIPROCESSING" not in env


def test_an_engine_on_every_core_runs_its_worker_in_the_engine_process(monkeypatch):
    """Below 4 cores the engine gets them all: its worker needs no process (and start-up) of its
    own, and one OpenMP thread per core; a bind in the spec or a multi-process flag keeps vLLM's
    own executor and binding."""
    monkeypatch.setattr("infra.cores.usable_cores", lambda: (0, 1))
    _, env = build_command(VllmEngineSpec(port=8000), Path("m"), EngineFlags(), python="python")
    assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0" and env["OMP_NUM_THREADS"] == "2"
    assert int(env["GOMP_SPINCOUNT"]) < 300_000  # waits sleep soon: no core held by a spinner
    assert "VLLM_CPU_OMP_THREADS_BIND" not in env
    _, env = build_command(VllmEngineSpec(port=8000, omp_threads_bind="0-1"), Path("m"),
                           EngineFlags(), python="python")
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "0-1" and "VLLM_ENABLE_V1_MULTIPROCESSING" not in env
    spec = VllmEngineSpec(port=8000, extra_args=["--distributed-executor-backend=mp"])
    _, env = build_command(spec, Path("m"), EngineFlags(), python="python")
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "0-1"


def test_plan_for_an_external_engine_claims_no_split():
    plan = plan_for(ExternalEngineSpec(kind="external", url="http://10.0.0.5:8000"), usable=[0, 1])
    assert plan.client == (0, 1) and plan.engine == () and not plan.pins_client


def test_a_pinned_command_runs_on_the_client_cores_only():
    usable = tuple(sorted(os.sched_getaffinity(0)))
    plan = CorePlan(usable=usable, engine=usable[1:], client=usable[:1], shared=False, reason="t")
    probe = [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"]
    out = subprocess.run(plan.pin(probe), capture_output=True, text=True, check=True).stdout
    assert out.strip() == str([usable[0]])
