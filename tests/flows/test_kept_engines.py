"""Engines a run keeps up between stages: which, for how long, and what using one costs."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from flows.engines import KeptEngines, engine_beside, spec_port_free
from flows.plan import plan
from flows.references import engines_to_keep
from flows.spec import ExternalEngineSpec, Spec
from infra.engine import Engine, EngineFacts
from tests.flows.checkpoints import W8A8, W8A16, make_checkpoint, make_emulated_checkpoint


def chain(tmp_path: Path, **engine) -> SimpleNamespace:
    """baseline -> w8 (emulated) -> a8 -> kv, and a control: the demo's shape."""
    base = make_checkpoint(tmp_path / "bf16")
    w8 = make_emulated_checkpoint(tmp_path / "w8", str(base), W8A16)
    a8 = make_checkpoint(tmp_path / "a8", W8A8)
    spec = Spec.model_validate({
        "candidate": "c", "baseline": {"checkpoint": str(base)},
        "engine": {"kind": "vllm", "device": "cpu", **engine},
        "stages": [{"name": "control", "kind": "control", "parent": "baseline"},
                   {"name": "w8", "kind": "weights", "parent": "baseline", "checkpoint": str(w8)},
                   {"name": "a8", "kind": "activations", "checkpoint": str(a8)},
                   {"name": "kv", "kind": "kv_cache", "engine_flags": {"kv_cache_dtype": "fp8"}}],
        "evalsets": [{"name": "math", "limit": 40}],
    })
    return SimpleNamespace(spec=spec, stages=plan(spec))


def test_the_baseline_is_kept_for_the_run_and_a_reference_until_its_last_race(tmp_path):
    prepared = chain(tmp_path)
    assert [s.name for s in prepared.stages] == ["baseline", "control", "w8", "a8", "kv"]
    # control and a8 (its parent w8 is emulated) race the baseline; kv races a8; the baseline's
    # engine also serves adaptive looks of any stage, so it stays to the last.
    assert engines_to_keep(prepared) == {"baseline": 4, "a8": 4}


def test_nothing_is_kept_on_a_gpu_without_a_plan_that_keeps_or_on_an_external_engine(tmp_path):
    cuda = chain(tmp_path, device="cuda")
    cuda.placement = None  # no GPU known: no slot for a kept engine (tests/flows/test_kept_placement.py)
    assert engines_to_keep(cuda) == {}
    external = chain(tmp_path)
    external.spec.engine = ExternalEngineSpec(kind="external", url="http://127.0.0.1:9")
    assert engines_to_keep(external) == {}


class FakeEngine(Engine):
    kind = "fake-kept"

    def __init__(self, port: int) -> None:
        self.spec = SimpleNamespace(port=port)
        self.running = False
        self.up = True

    def start(self) -> EngineFacts:
        self.running = True
        return EngineFacts(base_url=f"http://127.0.0.1:{self.spec.port}", model="m", startup_s=21.5)

    def stop(self) -> None:
        self.running = False

    def alive(self) -> bool:
        return self.up


def held(kept: KeptEngines, name: str, port: int) -> FakeEngine:
    import contextlib

    engine = FakeEngine(port)
    with contextlib.ExitStack() as own:
        facts = own.enter_context(engine)
        kept.hold(name, engine, facts, own.pop_all())
    return engine


def test_a_kept_engine_serves_until_released_and_the_run_stops_the_rest(tmp_path):
    with KeptEngines() as kept:
        baseline, a8 = held(kept, "baseline", 41001), held(kept, "a8", 41002)
        assert baseline.running and a8.running and kept.ports() == {41001, 41002}
        facts = kept.facts("baseline")
        assert facts.base_url == "http://127.0.0.1:41001"
        assert facts.startup_s == 0.0  # used, not started: no start-up in the stage's timings
        kept.release("a8")
        assert not a8.running and kept.names() == {"baseline"}
    assert not baseline.running


def test_a_kept_engine_that_died_is_dropped_and_started_again(tmp_path):
    with KeptEngines() as kept:
        engine = held(kept, "baseline", 41003)
        engine.up = False
        assert kept.facts("baseline") is None and kept.names() == set()
        assert not engine.running


def test_engine_beside_uses_the_kept_engine_and_starts_nothing(tmp_path):
    prepared = chain(tmp_path, port=41010)
    baseline = prepared.stages[0]
    with KeptEngines() as kept:
        held(kept, "baseline", 41010)
        with engine_beside(prepared.spec, baseline, tmp_path / "ref.log", 1, kept) as facts:
            assert facts.base_url == "http://127.0.0.1:41010"
        assert not (tmp_path / "ref.log").exists()  # no engine was launched
        # The next stage's own engine cannot take the port the kept baseline holds.
        moved = spec_port_free(prepared.spec, kept)
        assert moved.port != 41010 and prepared.spec.engine.port == 41010
    assert spec_port_free(prepared.spec, KeptEngines()).port == 41010
