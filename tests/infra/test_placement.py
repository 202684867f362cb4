"""The placement plan: where each CUDA engine goes and that it fits, before any engine starts."""

from __future__ import annotations

import subprocess

import pytest

from infra.errors import SpecError
from infra.placement import (
    GIB,
    RESERVE_BYTES,
    EngineNeed,
    Gpu,
    declared_gpus,
    host_gpus,
    parse_nvidia_smi,
    plan_placement,
)

H100 = "NVIDIA H100 80GB HBM3"
# An 8B model in bf16: 16 GB of weights, 128 KiB of KV per token (32 layers, 8 KV heads, 128).
LLAMA_8B = dict(weight_bytes=16 * 10**9, kv_bytes_per_token=131072, kv_tokens=4 * 8192)


def h100s(count: int) -> list[Gpu]:
    return [Gpu(index=i, name=H100, memory_bytes=81559 * 2**20) for i in range(count)]


def needs(**shape) -> list[EngineNeed]:
    shape = shape or LLAMA_8B
    return [EngineNeed("stage", "baseline", **shape), EngineNeed("stage", "fp8", **shape),
            EngineNeed("beside", "baseline", **shape)]


def test_one_gpu_splits_memory_instead_of_giving_the_second_engine_0_9():
    plan = plan_placement(h100s(1), needs())
    assert plan.shared
    assert plan.stage.devices == plan.beside.devices == [0]
    # Two engines at 0.47 fit together; two at 0.9 (vLLM's default, copied) did not.
    assert plan.stage.gpu_memory_utilization == plan.beside.gpu_memory_utilization == 0.47
    assert sum(s.gpu_memory_utilization for s in (plan.stage, plan.beside)) <= 0.94


def test_eight_gpus_give_the_engine_beside_its_own_identical_gpu():
    plan = plan_placement(h100s(8), needs())
    assert not plan.shared
    assert (plan.stage.visible_devices, plan.beside.visible_devices) == ("0", "1")
    assert plan.stage.gpu_memory_utilization == plan.beside.gpu_memory_utilization == 0.9
    assert "identical" in plan.note


def test_tensor_parallel_engines_take_disjoint_groups_of_gpus():
    plan = plan_placement(h100s(8), needs(), tensor_parallel_size=4)
    assert (plan.stage.visible_devices, plan.beside.visible_devices) == ("0,1,2,3", "4,5,6,7")


def test_different_gpus_are_not_paired_for_timing_and_the_engines_share_one_kind():
    mixed = [Gpu(index=0, name="NVIDIA A100-SXM4-80GB", memory_bytes=80 * GIB),
             Gpu(index=1, name=H100, memory_bytes=80 * GIB)]
    plan = plan_placement(mixed, needs())
    assert plan.shared and plan.stage.devices == plan.beside.devices


def test_an_engine_alone_keeps_the_default_share():
    plan = plan_placement(h100s(1), [EngineNeed("stage", "baseline", **LLAMA_8B)])
    assert plan.beside is None and plan.stage.gpu_memory_utilization == 0.9


def test_a_set_share_that_two_engines_cannot_hold_is_refused_naming_the_setting():
    with pytest.raises(SpecError, match=r"engine.gpu_memory_utilization 0.9: two engines share "
                       r"GPU\(s\) 0 .* set engine.gpu_memory_utilization at most 0.47"):
        plan_placement(h100s(1), needs(), utilization=0.9)
    assert plan_placement(h100s(1), needs(), utilization=0.4).stage.gpu_memory_utilization == 0.4


def test_an_engine_that_does_not_fit_its_share_is_refused_with_its_numbers():
    # 70B in bf16 (140 GB) on one 80 GB GPU: no split can hold it.
    big = dict(weight_bytes=140 * 10**9, kv_bytes_per_token=327680, kv_tokens=8192)
    with pytest.raises(SpecError, match=r"the stage engine of stage 'baseline' needs 135.9 GiB "
                       r"per GPU .* gets 37.4 GiB .* raise engine.tensor_parallel_size"):
        plan_placement(h100s(1), needs(**big))
    # Over 4 GPUs, two groups of 2 hold it: 70 GB + 1.25 GiB of KV each, and the reserve.
    plan = plan_placement(h100s(4), needs(**big), tensor_parallel_size=2)
    assert plan.engines[0]["need_gib"] == pytest.approx(
        (140 * 10**9 + 327680 * 8192) / 2 / GIB + RESERVE_BYTES / GIB, abs=0.01)


def test_more_gpus_per_engine_than_the_host_has_is_refused():
    with pytest.raises(SpecError, match="tensor_parallel_size 4 needs 4 GPUs; this host has 2"):
        plan_placement(h100s(2), needs(), tensor_parallel_size=4)


def test_no_known_gpu_is_refused_naming_the_settings():
    with pytest.raises(SpecError, match="engine.gpu_memory_gib and engine.gpu_count"):
        plan_placement([], needs())


def test_nvidia_smi_lines_are_read_and_a_host_without_it_has_none(monkeypatch):
    # `nvidia-smi --query-gpu=index,name,memory.total,memory.used --format=csv,noheader,nounits`
    text = "0, NVIDIA H100 80GB HBM3, 81559, 4\n1, NVIDIA H100 80GB HBM3, 81559, 60000\n"
    gpus = parse_nvidia_smi(text)
    assert [(g.index, g.name, g.memory_bytes, g.used_bytes) for g in gpus] == [
        (0, H100, 81559 * 2**20, 4 * 2**20), (1, H100, 81559 * 2**20, 60000 * 2**20)]
    monkeypatch.setattr("infra.placement.shutil.which", lambda name: None)
    assert host_gpus() == []

    def failing(*args, **kwargs):
        raise subprocess.CalledProcessError(9, "nvidia-smi")

    monkeypatch.setattr("infra.placement.shutil.which", lambda name: "/usr/bin/nvidia-smi")
    assert host_gpus(run=failing) == []
    assert declared_gpus(80, 2)[1].memory_bytes == 80 * GIB


def test_each_gpus_compute_capability_is_read_where_the_driver_reports_it(monkeypatch):
    """compute_cap decides what attention backend CUDA vLLM can pick (per-head KV scales need
    Hopper or Blackwell); a driver without that field still gives the GPUs, capability unknown."""
    monkeypatch.setattr("infra.placement.shutil.which", lambda name: "/usr/bin/nvidia-smi")
    answers = {"index,name,memory.total,memory.used": "0, NVIDIA A100-SXM4-80GB, 81920, 4\n"
               "1, NVIDIA H100 80GB HBM3, 81559, 0\n", "index,compute_cap": "0, 8.0\n1, 9.0\n"}

    def smi(args, **kwargs):
        fields = args[1].removeprefix("--query-gpu=")
        if fields not in answers:
            raise subprocess.CalledProcessError(2, "nvidia-smi")  # an older driver's answer
        return subprocess.CompletedProcess(args, 0, answers[fields], "")

    assert [(g.index, g.compute_capability) for g in host_gpus(run=smi)] == [(0, "8.0"), (1, "9.0")]
    del answers["index,compute_cap"]
    assert [(g.name, g.compute_capability) for g in host_gpus(run=smi)] == [
        ("NVIDIA A100-SXM4-80GB", None), (H100, None)]


def test_a_gpu_another_process_holds_is_named_before_any_engine_starts():
    busy = [Gpu(index=0, name=H100, memory_bytes=80 * GIB, used_bytes=50 * GIB)]
    with pytest.raises(SpecError, match=r"GPU 0 already holds 50.0 GiB \(another process\); its "
                       r"free 30.0 GiB is less than the 75.2 GiB its 2 engine\(s\)"):
        plan_placement(busy, needs())
    # A little memory held (a display, a monitor) leaves the split as it is.
    light = [busy[0].model_copy(update={"used_bytes": GIB // 2})]
    assert plan_placement(light, needs()).stage.gpu_memory_utilization == 0.47


def test_the_next_engine_waits_for_a_stopped_ones_memory_and_names_a_gpu_never_freed():
    from infra.errors import GpuBusyError
    from infra.placement import wait_until_free

    held = Gpu(index=0, name=H100, memory_bytes=80 * GIB, used_bytes=70 * GIB)
    freed = held.model_copy(update={"used_bytes": GIB})
    readings = iter([[held], [held], [freed]])
    naps: list[float] = []
    wait_until_free([0], 0.47, gpus=lambda: next(readings), sleep=naps.append)
    assert naps == [2.0, 2.0]  # released on the third reading: started then
    with pytest.raises(GpuBusyError, match=r"GPU 0 still holds 70.0 GiB after 4 s: its free "
                       r"10.0 GiB is less than the 37.6 GiB"):
        wait_until_free([0], 0.47, timeout_s=4, gpus=lambda: [held], sleep=lambda s: None)
    wait_until_free([0], 0.47, gpus=lambda: [])  # no nvidia-smi: nothing to confirm
    wait_until_free([1], 0.47, gpus=lambda: [held], sleep=lambda s: None)  # another GPU's memory
