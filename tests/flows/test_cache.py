"""The stage cache: keys change with what determines a stage's results, and only with that."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from flows.cache import StageCache, digest, stage_keys
from flows.plan import plan
from flows.spec import Spec
from infra.digest import checkpoint_digest, file_digest
from tests.flows.checkpoints import W8A16, make_checkpoint

PROFILE = {"requests": 12, "output_tokens": 32}
POLICY = {"tolerances": {"8bit": {"accuracy_margin": 0.08}}}


@pytest.fixture(autouse=True)
def digest_store(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))


def spec(tmp_path: Path, limit: int = 40, w8: str = "w8") -> Spec:
    base = tmp_path / "bf16"
    candidate = tmp_path / w8
    if not base.exists():
        make_checkpoint(base)
    if not candidate.exists():
        make_checkpoint(candidate, W8A16)
    return Spec.model_validate({
        "candidate": "c", "baseline": {"checkpoint": str(base)},
        "stages": [{"name": "w8", "kind": "weights", "checkpoint": str(candidate)},
                   {"name": "control", "kind": "control", "parent": "baseline"}],
        "evalsets": [{"name": "math", "limit": limit}],
    })


def keys(spec: Spec, profile=PROFILE, policy=POLICY, in_flight=64) -> dict[str, str]:
    return {name: digest(parts) for name, parts in stage_keys(plan(spec), spec, profile,
                                                              policy, in_flight).items()}


def test_same_inputs_same_keys_and_stages_differ(tmp_path):
    first, second = keys(spec(tmp_path)), keys(spec(tmp_path))
    assert first == second
    assert len(set(first.values())) == 3


def test_a_weights_change_moves_the_stage_and_not_the_baseline(tmp_path):
    before = keys(spec(tmp_path))
    weights = tmp_path / "w8" / "model.safetensors"
    weights.write_bytes(b"\1" * 1024)
    os.utime(weights, ns=(1, 1))  # a new mtime: the digest is read again
    after = keys(spec(tmp_path))
    assert after["baseline"] == before["baseline"] and after["w8"] != before["w8"]


def test_where_the_checkpoint_lies_does_not_matter_what_it_holds_does(tmp_path):
    here = keys(spec(tmp_path, w8="w8"))
    moved = keys(spec(tmp_path, w8="elsewhere"))
    assert here == moved


@pytest.mark.parametrize("change", ["limit", "profile", "in_flight", "policy"])
def test_eval_sets_and_profile_move_every_key_policy_only_later_stages(tmp_path, change):
    before = keys(spec(tmp_path))
    after = {
        "limit": lambda: keys(spec(tmp_path, limit=41)),
        "profile": lambda: keys(spec(tmp_path), profile=PROFILE | {"requests": 13}),
        "in_flight": lambda: keys(spec(tmp_path), in_flight=4),
        "policy": lambda: keys(spec(tmp_path), policy={"tolerances": {}}),
    }[change]()
    assert after["w8"] != before["w8"]
    assert (after["baseline"] == before["baseline"]) == (change == "policy")


def test_only_the_policy_that_decides_what_is_measured_moves_a_key(tmp_path):
    from gates.policy import GatePolicy

    policy = GatePolicy().model_dump(mode="json")
    before = keys(spec(tmp_path), policy=policy)

    def edited(section: str, **values) -> dict[str, str]:
        changed = policy | {section: policy[section] | values}
        return keys(spec(tmp_path), policy=changed)

    # Judged on what was measured: no re-measurement.
    assert edited("load", max_error_rate=0.05) == before
    assert edited("latency", max_tpot_p50_increase=0.4) == before  # advisory: fixed rounds
    # What decides the items scored, the looks' stop, or the rounds served: a new measurement.
    for section, values in (("quality", {"max_looks": 2}), ("length", {"max_change": 0.2}),
                            ("divergence", {"min_blocks": 20}),
                            ("latency", {"required": True})):
        assert edited(section, **values)["w8"] != before["w8"], section
    # The baseline's own corpus budget: every later stage scores the corpus it builds.
    budget = edited("divergence", corpus_tokens=12_000)
    assert budget["baseline"] != before["baseline"] and budget["w8"] != before["w8"]
    assert edited("divergence", min_blocks=20)["baseline"] == before["baseline"]
    required = policy | {"latency": policy["latency"] | {"required": True}}
    limits = required | {"latency": required["latency"] | {"max_tpot_p50_increase": 0.4}}
    assert keys(spec(tmp_path), policy=required)["w8"] != keys(spec(tmp_path), policy=limits)["w8"]


def test_a_stage_key_holds_its_parent_key(tmp_path):
    the_spec = spec(tmp_path)
    parts = stage_keys(plan(the_spec), the_spec, PROFILE, POLICY, 64)
    assert parts["w8"]["parent"] == digest(parts["baseline"]) == parts["w8"]["baseline"]
    assert "port" not in json.dumps(parts["w8"]["engine"]["command"]).replace("--port\", \"0", "")


def test_file_digest_is_remembered_by_size_and_mtime(tmp_path):
    path, store = tmp_path / "w.safetensors", tmp_path / "store.json"
    path.write_bytes(b"abc")
    first = file_digest(path, store)
    assert json.loads(store.read_text()) and first == file_digest(path, store)
    path.write_bytes(b"abd")
    os.utime(path, ns=(5, 5))
    assert file_digest(path, store) != first


def test_checkpoint_digest_ignores_unrelated_files(tmp_path):
    folder = make_checkpoint(tmp_path / "ckpt")
    before = checkpoint_digest(folder)
    (folder / "README.md").write_text("notes")
    assert checkpoint_digest(folder) == before


def test_store_and_restore_round_trip_and_replace(tmp_path):
    cache = StageCache(tmp_path / "cache")
    stage = tmp_path / "run" / "baseline"
    stage.mkdir(parents=True)
    (stage / "stage.json").write_text("{}")
    (stage / "quality").mkdir()
    (stage / "quality" / "items.json").write_text("[1]")
    assert cache.lookup("k") is None and not cache.restore("k", tmp_path / "x")
    cache.store("k", {"a": 1}, stage)
    (stage / "quality" / "items.json").write_text("[1, 2]")
    cache.store("k", {"a": 1}, stage)  # a grown baseline replaces its older copy
    target = tmp_path / "other-run" / "baseline"
    assert cache.restore("k", target)
    assert (target / "quality" / "items.json").read_text() == "[1, 2]"
    assert json.loads((target / "cache-key.json").read_text()) == {"a": 1}
    assert [p.name for p in (tmp_path / "cache").iterdir()] == ["k"]  # no scratch left behind


def test_an_api_key_moves_no_key_and_is_not_stored(tmp_path):
    plain = spec(tmp_path)
    guarded = plain.model_copy(update={"engine": plain.engine.model_copy(
        update={"extra_args": ["--api-key", "sk-planted-cache-1234"]})})
    assert keys(guarded) == keys(plain)
    parts = stage_keys(plan(guarded), guarded, PROFILE, POLICY, 64)
    assert "sk-planted-cache-1234" not in json.dumps(parts)


def test_only_the_baseline_and_the_final_candidate_search_capacity(tmp_path):
    from flows.plan import searches_capacity

    stages = plan(spec(tmp_path))
    on = {"enabled": True}
    assert [searches_capacity(s, stages, on) for s in stages] == [True, False, True]
    assert all(searches_capacity(s, stages, on | {"every_stage": True}) for s in stages)
    assert not any(searches_capacity(s, stages, {"enabled": False}) for s in stages)
    profile = dict(PROFILE, capacity={"enabled": True})
    parts = stage_keys(stages, spec(tmp_path), profile, POLICY, 64)
    assert [p["capacity_search"] for p in parts.values()] == [True, False, True]


def test_twins_of_the_same_weights_are_one_key_whatever_they_are_named(tmp_path):
    """A repair built as int8 per channel is the W8A16 twin byte for byte, named otherwise: its
    stage takes the measured stage's entry (the plan's place of an emulated stage, which runs no
    load, changes nothing either); another quantization_config is another key."""
    from tests.flows.checkpoints import W4A16, make_emulated_checkpoint

    base = make_checkpoint(tmp_path / "bf16")
    twins = [make_emulated_checkpoint(tmp_path / name, source, W8A16)
             for name, source in (("w8", "smollm2-w8a16"), ("repair", "bf16-int8-channel"))]
    other = make_emulated_checkpoint(tmp_path / "w4", "smollm2-w4a16", W4A16)
    assert checkpoint_digest(twins[0]) == checkpoint_digest(twins[1]) != checkpoint_digest(other)
    found = Spec.model_validate({
        "candidate": "c", "baseline": {"checkpoint": str(base)},
        "stages": [{"name": "w8", "kind": "weights", "checkpoint": str(twins[0])},
                   {"name": "w4", "kind": "weights", "parent": "baseline",
                    "checkpoint": str(other)},
                   {"name": "w4-repair", "kind": "repair", "parent": "baseline",
                    "checkpoint": str(twins[1])}],
        "evalsets": [{"name": "math", "limit": 40}],
    })
    found_keys = keys(found, profile=dict(PROFILE, capacity={"enabled": True}))
    assert found_keys["w4-repair"] == found_keys["w8"] != found_keys["w4"]


def test_a_stage_restored_from_another_stages_entry_is_stored_under_its_own_name(tmp_path,
                                                                                  monkeypatch):
    from contextlib import nullcontext
    from types import SimpleNamespace

    import flows.stage
    from flows.stage import measure_one
    from gates.record import RunManifest, StageRecord
    from tests.gates.records import record

    monkeypatch.setattr(flows.stage, "get_run_logger", lambda: SimpleNamespace(info=print))
    measured = record("w8", "baseline", [1.0, 0.0] * 10)
    measured.save(tmp_path / "measured")
    cache = StageCache(tmp_path / "cache")
    cache.store("k", {"a": 1}, tmp_path / "measured")
    tracker = SimpleNamespace(stage_run=lambda *_: nullcontext(), log_stage=lambda *_, **__: None)
    run = SimpleNamespace(
        cache=cache, parts={}, keys={"w4-repair": "k"}, results_dir=tmp_path / "run",
        manifest=RunManifest(candidate="c", stages=["baseline"]), tracker=tracker, records={},
        no_cache=False, reused=set(), prepared=SimpleNamespace(spec=SimpleNamespace(candidate="c")))
    stage = SimpleNamespace(name="w4-repair", kind="repair", parent="baseline",
                            checkpoint=tmp_path / "repairs" / "int8-channel-dequant")
    got = measure_one(stage, run)
    assert (got.name, got.kind, got.parent) == ("w4-repair", "repair", "baseline")
    # Its engine command names its own checkpoint (the same bytes), as its verdict shows it.
    assert got.facts.model == str(stage.checkpoint) and "w8" not in got.facts.command
    assert got.facts.command[got.facts.command.index("--model") + 1] == str(stage.checkpoint)
    stored = StageRecord.read(tmp_path / "run" / "w4-repair")
    assert (stored.name, stored.kind) == ("w4-repair", "repair")
    assert stored.quality == measured.quality and run.manifest.reused == {"w4-repair": "k"}
