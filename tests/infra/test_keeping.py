"""Engines kept up between stages on CUDA: the slot each kept engine holds, or why none is kept."""

from __future__ import annotations

from infra.keeping import keep_up
from infra.placement import GIB, SHARED_TOTAL, EngineNeed, Gpu, plan_placement

H100 = "NVIDIA H100 80GB HBM3"
# baseline -> a8 -> kv, each timed against its parent: baseline kept to the end, a8 until kv.
STAGES = ("baseline", "a8", "kv")


def h100s(count: int) -> list[Gpu]:
    return [Gpu(index=i, name=H100, memory_bytes=81559 * 2**20) for i in range(count)]


def shape(weight_gb: float) -> dict:
    """A bf16 model of `weight_gb` GB, 128 KiB of KV per token, the KV for 4 x 8192 tokens."""
    return dict(weight_bytes=int(weight_gb * 10**9), kv_bytes_per_token=131072, kv_tokens=4 * 8192)


def today(gpus: list[Gpu], size: dict, tp: int = 1):
    """The plan without kept engines: each stage's own, and the baseline and a8 beside."""
    return plan_placement(gpus, [EngineNeed("stage", name, **size) for name in STAGES]
                          + [EngineNeed("beside", name, **size) for name in STAGES[:2]], tp)


def kept(size: dict) -> list[EngineNeed]:
    return [EngineNeed("kept", "baseline", **size, during=STAGES),
            EngineNeed("kept", "a8", **size, during=("a8", "kv")),
            EngineNeed("stage", "kv", **size, during=("kv",))]


def test_an_8b_model_keeps_three_engines_on_one_h100_within_the_shared_total():
    size = shape(16)
    plan = keep_up(today(h100s(1), size), kept(size))
    assert set(plan.kept) == {"baseline", "a8"} and plan.up_at_once == 3
    slots = [plan.kept["baseline"], plan.kept["a8"], plan.slot(False, "kv")]
    assert {tuple(slot.devices) for slot in slots} == {(0,)}
    assert [slot.gpu_memory_utilization for slot in slots] == [0.31] * 3
    assert sum(slot.gpu_memory_utilization for slot in slots) <= SHARED_TOTAL
    assert (plan.kept["baseline"].until, plan.kept["a8"].until) == ("kv", "kv")
    assert plan.describe()[-1] == ("engines kept up between stages: baseline through kv, a8 "
                                   "through kv; at most 3 up at once, each in a slot of its own")


def test_a_14b_model_whose_three_engines_do_not_fit_one_h100_is_not_kept_and_says_why():
    size = shape(28)  # 26.1 GiB of weights, 4 GiB of KV, 3 GiB reserve: 33.1 GiB an engine
    before = today(h100s(1), size)
    assert before.stage.gpu_memory_utilization == 0.47  # two fit, as they did
    plan = keep_up(before, kept(size))
    assert plan.kept == {} and plan.slot(True, "baseline") == before.beside
    assert plan.stage == before.stage and plan.engines == before.engines
    assert plan.describe()[-1] == (
        "engines not kept between stages: 3 engines may be up at once (kv, baseline, a8: 33.1, "
        "33.1, 33.1 GiB per GPU) and together need 99.2 GiB, more than the 74.9 GiB (0.94) "
        "engines sharing GPU(s) 0 may take; each is stopped after its stage and started again "
        "when a later stage needs it")


def test_unequal_engines_get_what_each_needs_and_an_equal_part_of_the_rest():
    big, small = shape(30), shape(8)  # 34.9 and 14.4 GiB: equal thirds (24.9 GiB) hold neither
    needs = [EngineNeed("kept", "baseline", **big, during=STAGES),
             EngineNeed("kept", "a8", **small, during=("a8", "kv")),
             EngineNeed("stage", "kv", **small, during=("kv",))]
    plan = keep_up(today(h100s(1), big), needs)
    shares = {row["stage"]: row["gpu_memory_utilization"] for row in plan.engines}
    assert sum(shares.values()) <= SHARED_TOTAL
    for row in plan.engines:
        assert row["need_gib"] <= row["share_gib"]
    assert shares["baseline"] > shares["a8"] == shares["kv"]


def test_engines_never_up_at_the_same_stage_take_turns_in_one_slot():
    # baseline -> w8 (emulated: not kept, a8's adaptive looks serve it beside a8) -> a8 -> kv
    size = shape(16)
    needs = [EngineNeed("kept", "baseline", **size, during=("baseline", "w8", "a8", "kv")),
             EngineNeed("stage", "w8", **size, during=("w8",)),
             EngineNeed("kept", "a8", **size, during=("a8", "kv")),
             EngineNeed("stage", "kv", **size, during=("kv",)),
             EngineNeed("beside", "w8", **size, during=("a8",))]
    plan = keep_up(today(h100s(8), size), needs)
    # Three up at once at most (a8's stage: baseline, a8, w8 beside): the beside engine takes
    # the stage engines' GPU, where no stage engine is up during a8.
    assert plan.up_at_once == 3
    assert plan.beside == plan.stage
    assert len({tuple(slot.devices) for slot in (plan.stage, *plan.kept.values())}) == 3


def test_eight_gpus_give_each_kept_engine_its_own_and_two_gpus_say_they_are_too_few():
    size = shape(16)
    plan = keep_up(today(h100s(8), size, tp=2), kept(size))
    devices = [plan.slot(False, "kv").visible_devices, plan.kept["baseline"].visible_devices,
               plan.kept["a8"].visible_devices]
    assert devices == ["0,1", "2,3", "4,5"]
    assert all(slot.gpu_memory_utilization == 0.9 for slot in plan.kept.values())
    assert "2 left unused (at most 3 engines are up at once)" in plan.describe()[0]
    two = keep_up(today(h100s(2), size), kept(size))
    assert two.kept == {} and "3 engines may be up at once (kv, baseline, a8), and this host " \
        "has 2 group(s) of 1 GPU(s)" in two.keeping


def test_a_set_share_is_kept_only_where_every_engine_up_at_once_can_take_it():
    size = shape(8)
    assert keep_up(plan_placement(h100s(1), [EngineNeed("stage", "baseline", **size),
                                             EngineNeed("beside", "baseline", **size)], 1, 0.3),
                   kept(size), utilization=0.3).kept["a8"].gpu_memory_utilization == 0.3
    refused = keep_up(today(h100s(1), size), kept(size), utilization=0.4)
    assert refused.kept == {} and "engine.gpu_memory_utilization 0.4 each would take 1.2 of " \
        "GPU(s) 0, more than the 0.94" in refused.keeping


def test_a_gpu_another_process_holds_memory_on_leaves_less_to_split():
    # 30 GiB held elsewhere: two engines at 0.3 fit the rest, three do not.
    busy = [h100s(1)[0].model_copy(update={"used_bytes": 30 * GIB})]
    size = shape(8)
    before = plan_placement(busy, [EngineNeed("stage", "baseline", **size),
                                   EngineNeed("beside", "baseline", **size)], 1, 0.3)
    plan = keep_up(before, kept(size), utilization=0.3)
    assert plan.kept == {} and "would take 0.9 of GPU(s) 0, more than the 0.62" in plan.keeping
