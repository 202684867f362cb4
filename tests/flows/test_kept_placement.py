"""A CUDA run keeps engines up between stages where its placement plan has room: which it keeps,
the GPUs and share each engine is started with, and that the engines up at any one stage never
overlap (on one GPU their shares sum within SHARED_TOTAL; on more, each has GPUs of its own)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from flows.engines import placed, plan_run_placement, spec_port_free
from flows.plan import plan, reference_of
from flows.references import engines_to_keep
from infra.placement import SHARED_TOTAL, declared_gpus
from tests.flows.test_kept_engines import chain as cpu_chain
from tests.flows.test_placement_plan import DEMO_CONFIG


def demo_shaped(folder: Path) -> Path:
    config = json.loads((folder / "config.json").read_text()) | DEMO_CONFIG
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def chain(tmp_path: Path, gpus: list, **engine) -> SimpleNamespace:
    """The CPU tests' chain (baseline -> control, w8 (emulated) -> a8 -> kv) on CUDA, in the demo
    model's shape, planned on `gpus` as the run plans it before any engine starts."""
    spec = cpu_chain(tmp_path, device="cuda", **engine).spec
    for folder in {spec.baseline.checkpoint, *(s.checkpoint for s in spec.stages if s.checkpoint)}:
        demo_shaped(Path(folder))
    stages = plan(spec)
    return SimpleNamespace(spec=spec, stages=stages,
                           placement=plan_run_placement(spec, stages, 5120, gpus))


def engines_up(run: SimpleNamespace) -> list[dict[str, tuple[str, float]]]:
    """Each set of engines that may be up at once, stage by stage, as (CUDA_VISIBLE_DEVICES,
    share) each was started with: those kept from earlier stages, the stage's own, and one
    started beside it at a time (its reference, the baseline for more items, its parent for its
    adaptive looks: flows/adaptive.py stops one before it starts another)."""
    keep, names = engines_to_keep(run), [stage.name for stage in run.stages]
    started = {}  # a kept engine keeps what it was started with
    moments = []
    for index, stage in enumerate(run.stages):
        up = {name: started[name] for name, last in keep.items()
              if names.index(name) < index <= last}
        own = spec_port_free(run.spec, None, run.placement, stage.name)
        up[stage.name] = started[stage.name] = (own.cuda_visible_devices,
                                                own.gpu_memory_utilization)
        moments.append(up)
        parent = next((s for s in run.stages if s.name == stage.parent), None)
        for other in (reference_of(stage, run.stages), run.stages[0], parent):
            if other is not None and other.name not in up:
                engine = placed(run.spec.engine, run.placement, beside=True, stage=other.name)
                moments.append(up | {f"{other.name} beside": (engine.cuda_visible_devices,
                                                               engine.gpu_memory_utilization)})
    return moments


def test_the_demo_on_one_80gb_gpu_keeps_its_engines_and_their_shares_fit_together(tmp_path):
    run = chain(tmp_path, declared_gpus(80, 1))
    assert engines_to_keep(run) == {"baseline": 4, "a8": 4}
    assert set(run.placement.kept) == {"baseline", "a8"} and run.placement.up_at_once == 3
    moments = engines_up(run)
    # a8's stage: the baseline kept, a8's own in its kept slot, w8 beside it for its looks.
    assert {"baseline", "a8", "w8 beside"} in [set(up) for up in moments]
    assert max(len(up) for up in moments) == 3
    for up in moments:
        assert {devices for devices, _ in up.values()} == {"0"}
        assert sum(share for _, share in up.values()) <= SHARED_TOTAL, up
    slots = [run.placement.stage, *run.placement.kept.values()]
    assert sum(slot.gpu_memory_utilization for slot in slots) <= SHARED_TOTAL
    assert run.placement.describe()[-1].startswith(
        "engines kept up between stages: baseline through kv, a8 through kv; at most 3 up at once")


def test_a_model_whose_three_engines_do_not_fit_one_gpu_is_not_kept_and_the_plan_says_why(tmp_path):
    # About 3.1 GiB an engine (mostly the reserve) on a 9 GiB GPU: two fit (today's split), three
    # (the baseline and a8 kept, and the stage's own) do not.
    run = chain(tmp_path, declared_gpus(9, 1), gpu_memory_gib=9)
    assert run.placement.kept == {} and engines_to_keep(run) == {}
    assert run.placement.stage.gpu_memory_utilization == 0.47  # each stage stops its engines
    line = run.placement.describe()[-1]
    assert line.startswith("engines not kept between stages: 3 engines may be up at once "
                           "(control/w8/kv, baseline, a8: 3.1, 3.1, 3.1 GiB per GPU) and together "
                           "need 9.3 GiB, more than the 8.5 GiB (0.94)"), line
    for up in engines_up(run):
        assert len(up) <= 2 and sum(share for _, share in up.values()) <= SHARED_TOTAL


def test_an_8_gpu_host_keeps_each_engine_on_gpus_of_its_own(tmp_path):
    run = chain(tmp_path, declared_gpus(80, 8), tensor_parallel_size=2)
    assert engines_to_keep(run) == {"baseline": 4, "a8": 4}
    for up in engines_up(run):
        devices = [devices for devices, _ in up.values()]
        assert len(set(devices)) == len(devices), up  # CUDA_VISIBLE_DEVICES distinct
        assert len({gpu for group in devices for gpu in group.split(",")}) == 2 * len(devices)
        assert {share for _, share in up.values()} == {0.9}
    kept = run.placement.kept
    assert (run.placement.stage.visible_devices, kept["baseline"].visible_devices,
            kept["a8"].visible_devices) == ("0,1", "2,3", "4,5")
    assert "2 left unused (at most 3 engines are up at once)" in run.placement.describe()[0]


def test_every_engine_kind_says_whether_it_can_keep_engines(tmp_path):
    from flows.spec import ExternalEngineSpec
    from infra.sglang_engine import SglangEngineSpec
    from infra.vllm_args import VllmEngineSpec

    assert VllmEngineSpec(kind="vllm", device="cpu").keeps_engines()
    assert VllmEngineSpec(kind="vllm", device="cuda").keeps_engines()
    assert SglangEngineSpec(kind="sglang").keeps_engines()
    assert not ExternalEngineSpec(kind="external", url="http://127.0.0.1:9").keeps_engines()
