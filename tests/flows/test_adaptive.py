"""Adaptive sample size: more items while the pooled accuracy rule is inconclusive."""

from __future__ import annotations

import contextlib
from collections import Counter

import pytest

from evalsets.results import MoreItems, QualityItem, QualityResult, TaskQuality
from evalsets.runner import _slice
from evalsets.spec import EvalSetSpec
from flows import adaptive
from flows.plan import plan
from flows.spec import load_spec
from gates.accuracy import more_items
from gates.policy import GatePolicy
from gates.record import StageRecord
from infra.engine import EngineFacts
from tests.flows.test_spec import write_spec
from tests.gates.records import asked_as

POLICY = GatePolicy()


def answers(name: str, scores: list[float]) -> QualityResult:
    items = [QualityItem(id=str(i), prompt_hash="h", response="r", score=s, output_tokens=5)
             for i, s in enumerate(scores)]
    return QualityResult(tasks={name: TaskQuality(task=name, metric="acc", value=0.0, items=items)})


def truth(i: int) -> float:
    return float(i % 3 == 0)  # the baseline gets a third right; the stage repeats it exactly


def test_slice_selects_a_later_batch_after_the_group_filter():
    from datasets import Dataset

    data = Dataset.from_list([{"id": i, "g": "a" if i % 2 else "b"} for i in range(20)])
    only_a = _slice(lambda ds: ds.filter(lambda d: d["g"] == "a"), 3, 6)
    assert [d["id"] for d in only_a(data)] == [7, 9, 11]
    assert [d["id"] for d in _slice(None, 18, 30)(data)] == [18, 19]


def test_more_items_only_while_inconclusive_and_within_the_pool():
    small = answers("math", [truth(i) for i in range(40)])
    assert more_items(small, small, "8bit", POLICY, {"math": 1000}) == {"math": 80}
    assert more_items(small, small, "8bit", POLICY, {"math": 40}) is None  # nothing left
    large = answers("math", [truth(i) for i in range(120)])
    assert more_items(large, large, "8bit", POLICY, {"math": 1000}) is None  # decided: pass


def test_grow_until_decided_scores_the_baseline_once_and_stops_when_decided(tmp_path, monkeypatch):
    spec = load_spec(write_spec(tmp_path, stages=[{"name": "control", "kind": "control"}],
                                evalsets=[{"name": "math", "limit": 40}]))
    baseline, control = plan(spec)
    results = tmp_path / "run"
    StageRecord(name="baseline", kind="baseline", parent=None, axes={}, comparability=asked_as(40),
                quality=answers("math", [truth(i) for i in range(40)])).save(results / "baseline")
    scored: list[tuple[str, int, int]] = []

    def fake_score(facts, evalset, start, stop, out_dir, tokenizer_dir, template, concurrent,
                   structured_output=False):
        scored.append((facts.model, start, stop))
        return answers("math", [truth(i) for i in range(stop)]).tasks["math"].items[start:]

    @contextlib.contextmanager
    def fake_engine(spec_, stage, log_path, port_offset, kept=None, placement=None):
        assert stage.name == "baseline" and port_offset == 2
        yield EngineFacts(base_url="http://b", model="baseline", command=["vllm"])

    monkeypatch.setattr(adaptive, "_score", fake_score)
    monkeypatch.setattr(adaptive, "engine_beside", fake_engine)
    stage_facts = EngineFacts(base_url="http://s", model="control", command=["vllm"])
    quality = adaptive.grow_until_decided(
        control, answers("math", [truth(i) for i in range(40)]), stage_facts, spec, baseline,
        results, POLICY, {"math": 1000}, 2)
    assert scored == [("baseline", 40, 80), ("control", 40, 80)]  # one look was enough
    assert quality.looks == 2 and quality.added_items == {"math": 40}
    # What the set can reach by the last look (40 x 2 x 2), which holds its own margin.
    assert QualityResult.read(results / "control" / "quality").reach == {"math": 160}
    assert len(quality.tasks["math"].items) == 80
    stored = StageRecord.read(results / "baseline")
    assert len(stored.quality.tasks["math"].items) == 80  # the next stage finds them scored
    assert QualityResult.read(results / "control" / "quality").looks == 2
    # The baseline's record stays as its stage measured it; the 40 more are a record of their own.
    assert len(QualityResult.read(results / "baseline" / "quality").tasks["math"].items) == 40
    more = MoreItems.kept(results / "baseline")
    assert [i.id for i in more.tasks["math"]] == [str(i) for i in range(40, 80)]
    assert more.asked_by == {"math": ["control"]}
    stored.save(results / "baseline")  # a record read with them saves its own items only
    assert len(QualityResult.read(results / "baseline" / "quality").tasks["math"].items) == 40
    assert len(StageRecord.read(results / "baseline").quality.tasks["math"].items) == 80


def test_a_stage_that_already_fails_accuracy_gets_no_look_for_its_open_length_rule(
        tmp_path, monkeypatch):
    """Half the baseline's right answers lost at 120 items: accuracy fails at this look,
    and the first look that decides a rule is its verdict. Its lengths, scattered, leave the
    length rule open; more items would only be engine time spent on a rollback."""
    from infra.progress import progress

    spec = load_spec(write_spec(tmp_path, stages=[{"name": "control", "kind": "control"}],
                                evalsets=[{"name": "math", "limit": 120}]))
    baseline, control = plan(spec)
    results = tmp_path / "run"
    StageRecord(name="baseline", kind="baseline", parent=None, axes={},
                comparability=asked_as(120),
                quality=answers("math", [truth(i) for i in range(120)])).save(results / "baseline")
    broken = answers("math", [truth(i) if i % 2 else 0.0 for i in range(120)])
    for i, item in enumerate(broken.tasks["math"].items):
        item.output_tokens = (2, 5, 9)[i % 3]
    base_record = StageRecord.read(results / "baseline")
    assert more_items(broken, base_record.quality, "8bit", POLICY, {"math": 1000}), (
        "the length rule alone would ask for a look")
    assert "quality.accuracy" in adaptive.accuracy_fails_for_good(control, broken, base_record,
                                                                  base_record, POLICY)
    lines: list[str] = []
    monkeypatch.setattr(progress, "terminal", False)
    monkeypatch.setattr(progress, "write", lines.append)
    monkeypatch.setattr(adaptive, "_score", lambda *a, **k: pytest.fail("scored more items"))
    quality = adaptive.grow_until_decided(
        control, broken, EngineFacts(base_url="http://s", model="control", command=["vllm"]),
        spec, baseline, results, POLICY, {"math": 1000}, 2)
    assert quality.looks <= 1 and len(quality.tasks["math"].items) == 120
    assert any("already fails quality.accuracy" in line for line in lines), lines


def test_an_unresolved_length_rule_grows_the_sets_as_far_as_the_parent_reaches():
    base = answers("math", [truth(i) for i in range(200)])
    stage = answers("math", [truth(i) for i in range(120)])
    for i, item in enumerate(stage.tasks["math"].items):  # lengths scattered around the parent's
        item.output_tokens = (2, 5, 9)[i % 3]
    assert more_items(stage, base, "8bit", POLICY, {"math": 1000}) == {"math": 240}
    parent = answers("math", [truth(i) for i in range(150)])
    assert more_items(stage, base, "8bit", POLICY, {"math": 1000}, parent) == {"math": 150}
    parent.tasks["math"].items = parent.tasks["math"].items[:120]
    assert more_items(stage, base, "8bit", POLICY, {"math": 1000}, parent) is None
    # A parent served again for the new items no longer bounds the growth.
    assert more_items(stage, base, "8bit", POLICY, {"math": 1000}, parent,
                      parent_served=True) == {"math": 240}


def test_no_look_for_a_length_rule_that_answers_cut_at_the_budget_keep_unresolved():
    """Most answers run to the budget (3 in 5 on each side, not always the same items, as
    sampled answers do): the length ratio cannot pass however many items come (the share cut
    stays), so no look is asked for it; a stage whose accuracy is decided gets none."""
    base = answers("math", [truth(i) for i in range(200)])
    stage = answers("math", [truth(i) for i in range(120)])
    for quality in (base, stage):
        for i, item in enumerate(quality.tasks["math"].items):
            cut = i % 5 in ((1, 2, 3) if quality is stage else (0, 1, 2))
            lengths = (9, 2, 5) if quality is stage else (2, 5, 9)  # scattered around x1
            item.output_tokens = 96 if cut else lengths[i % 3]
            item.finish_reason = "length" if cut else "stop"
    assert more_items(stage, base, "8bit", POLICY, {"math": 1000}) is None


@pytest.mark.parametrize("placement", [None, "one GPU"])
def test_a_chain_stage_serves_its_parent_again_for_the_length_rule(tmp_path, monkeypatch,
                                                                   placement):
    """activations is judged on length against weights: at the first look's 60 items the ratio is
    unresolved, so weights answers the new items beside it (and the baseline too). On a planned
    GPU host the plan has one place beside the stage: one of the two is up at a time."""
    spec = load_spec(write_spec(tmp_path))
    baseline, weights, activations, _ = plan(spec)
    results = tmp_path / "run"

    def lengths(n: int, changed: bool = False) -> QualityResult:
        quality = answers("math", [truth(i) for i in range(n)])
        for i, item in enumerate(quality.tasks["math"].items):
            item.output_tokens = 3 * (2, 5, 9)[i % 3] + (i * 7) % 4
            if changed:  # half the answers change length, x1.06 on the whole: unresolved at 60
                item.output_tokens = round(item.output_tokens * (1.8, 1, 0.7, 1)[i % 4])
        return quality

    StageRecord(name="baseline", kind="baseline", parent=None, axes={}, comparability=asked_as(60),
                quality=lengths(60)).save(results / "baseline")
    StageRecord(name="weights", kind="weights", parent="baseline", axes={},
                comparability=asked_as(60), quality=lengths(60)).save(results / "weights")
    scored: list[tuple[str, int, int]] = []

    def fake_score(facts, evalset, start, stop, out_dir, tokenizer_dir, template, concurrent,
                   structured_output=False):
        scored.append((facts.model, start, stop))
        return lengths(stop, facts.model == "activations").tasks["math"].items[start:]

    offsets: dict[str, int] = {}
    up: set[str] = set()
    most_up = []

    @contextlib.contextmanager
    def fake_engine(spec_, stage, log_path, port_offset, kept=None, placement=None):
        offsets[stage.name] = port_offset
        up.add(stage.name)
        most_up.append(len(up))
        yield EngineFacts(base_url=f"http://{stage.name}", model=stage.name, command=["vllm"])
        up.discard(stage.name)

    from infra.progress import progress

    lines: list[str] = []
    monkeypatch.setattr(progress, "terminal", False)
    monkeypatch.setattr(progress, "write", lines.append)
    monkeypatch.setattr(adaptive, "_score", fake_score)
    monkeypatch.setattr(adaptive, "engine_beside", fake_engine)
    stage_facts = EngineFacts(base_url="http://s", model="activations", command=["vllm"])
    quality = adaptive.grow_until_decided(
        activations, lengths(60, True), stage_facts, spec, baseline, results, POLICY,
        {"math": 1000}, 2, parent_stage=weights, placement=placement)
    assert ("weights", 60, 120) in scored, scored
    # The look line names the open rule it grows the set for: length, not accuracy.
    look = next(line for line in lines if "not decided yet" in line)
    assert "look 2 with math 120 items (length, length.baseline)" in look, look
    assert "quality" not in look, look
    assert not up  # every engine started beside the stage has stopped
    assert max(most_up) == (1 if placement else 2)
    assert offsets["weights"] not in (offsets.get("baseline"), 0)
    grown = StageRecord.read(results / "weights")
    assert len(grown.quality.tasks["math"].items) == len(quality.tasks["math"].items) > 60
    assert grown.quality.own_sizes == {"math": 60}  # its own verdict rests on its own 60
    assert len(QualityResult.read(results / "weights" / "quality").tasks["math"].items) == 60
    assert MoreItems.kept(results / "weights").asked_by == {"math": ["activations"]}


def test_more_items_show_their_progress(tmp_path, monkeypatch):
    from flows import adaptive
    from infra.progress import progress

    lines: list[str] = []
    monkeypatch.setattr(progress, "terminal", False)
    monkeypatch.setattr(progress, "write", lines.append)

    def fake_run(base_url, model, batch, out_dir, count, template, concurrent, start, on_items,
                 structured_output, tokenizer_dir):
        on_items(batch.limit)
        return type("Task", (), {"items": []})()

    monkeypatch.setattr(adaptive, "run_evalset", fake_run)
    monkeypatch.setattr(adaptive, "token_counter", lambda folder: len)
    facts = type("Facts", (), {"base_url": "http://x", "model": "m", "kv_cache_tokens": None})()
    adaptive._score(facts, EvalSetSpec(name="math", limit=60), 60, 240,
                    tmp_path / "w8" / "quality", tmp_path, True, 4)
    assert lines == ["w8: math items 61-240: 0/180 items", "w8: math items 61-240: 180/180 items in 0s"]


def test_a_stage_that_already_fails_for_good_gets_no_more_looks(tmp_path):
    from types import SimpleNamespace

    from flows.tasks import failed_for_good
    from gates.policy import load_policy
    from tests.gates.records import record

    scores = [1.0, 0.0] * 30
    base = record("baseline", None, scores)
    base.save(tmp_path / "baseline")
    prepared = SimpleNamespace(stages=[SimpleNamespace(name="baseline")],
                               policy=load_policy("default"))
    axes = SimpleNamespace(model_dump=lambda **_: dict(base.axes))
    stage = SimpleNamespace(name="w4", kind="weights", parent="baseline", axes=axes)
    for kl, perplexity, expected in ((0.002, 10.0, []), (0.9, 10.0, ["divergence.kl"]),
                                     (0.002, 14.0, ["perplexity.parent"])):
        bad = record("w4", "baseline", scores, kl=kl, perplexity=perplexity)
        assert failed_for_good(stage, bad.quality, tmp_path, prepared) == expected


def test_an_unresolved_length_rule_grows_only_the_sets_whose_lengths_changed():
    base = answers("math", [truth(i) for i in range(200)])
    base.tasks |= answers("long_context", [truth(i) for i in range(200)]).tasks
    stage = answers("math", [truth(i) for i in range(120)])
    stage.tasks |= answers("long_context", [truth(i) for i in range(40)]).tasks
    for i, item in enumerate(stage.tasks["math"].items):  # lengths scattered around the parent's
        item.output_tokens = (1, 5, 12)[i % 3]
    # long_context kept every length: more of it would only pull the ratio toward x1.
    assert more_items(stage, base, "8bit", POLICY, {"math": 1000, "long_context": 1000}) == {
        "math": 240, "long_context": 40}


def test_a_stage_whose_length_already_fails_gets_no_more_looks(tmp_path, monkeypatch):
    """Accuracy is inconclusive at 40 items, but every answer is twice its baseline's length: the
    required length rule fails even at one look's share of alpha, so no engine is served again.
    Lengths that scatter around the baseline's (an unresolved ratio) still grow."""
    spec = load_spec(write_spec(tmp_path, stages=[{"name": "control", "kind": "control"}],
                                evalsets=[{"name": "math", "limit": 40}]))
    baseline, control = plan(spec)
    results = tmp_path / "run"
    base = answers("math", [truth(i) for i in range(40)])
    StageRecord(name="baseline", kind="baseline", parent=None, axes={}, comparability=asked_as(40),
                quality=base).save(results / "baseline")
    served: list[str] = []

    def fake_score(facts, evalset, start, stop, *_, **__):
        served.append(facts.model)
        return answers("math", [truth(i) for i in range(stop)]).tasks["math"].items[start:]

    @contextlib.contextmanager
    def fake_engine(spec_, stage, *_, **__):
        yield EngineFacts(base_url="http://b", model=stage.name, command=["vllm"])

    monkeypatch.setattr(adaptive, "_score", fake_score)
    monkeypatch.setattr(adaptive, "engine_beside", fake_engine)
    facts = EngineFacts(base_url="http://s", model="control", command=["vllm"])
    longer = answers("math", [truth(i) for i in range(40)])
    for item in longer.tasks["math"].items:
        item.output_tokens = 11  # (11 + 1) / (5 + 1): x2.0
    base_record = StageRecord.read(results / "baseline")
    assert adaptive.length_fails_for_good(control, longer, base_record, base_record,
                                          POLICY) == ["length"]
    quality = adaptive.grow_until_decided(control, longer, facts, spec, baseline, results,
                                          POLICY, {"math": 1000}, 2)
    assert served == [] and quality.looks == 1
    scattered = answers("math", [truth(i) for i in range(40)])
    for i, item in enumerate(scattered.tasks["math"].items):
        item.output_tokens = (2, 5, 9)[i % 3]
    assert adaptive.length_fails_for_good(control, scattered, base_record, base_record,
                                          POLICY) == []
    adaptive.grow_until_decided(control, scattered, facts, spec, baseline, results, POLICY,
                                {"math": 1000}, 2)
    assert served  # it grew


def test_a_kv_stage_scores_only_its_unresolved_bucket_on_both_engines(tmp_path, monkeypatch):
    """The long-context set resolves as a whole, but its 4k bucket (3 of its 10 right broken)
    does not: the next look asks the baseline and the stage for the 4k bucket's next items only,
    each group's own next items in the data's order, and the stage is then compared with the
    baseline group by group."""
    from evalsets.jsonl import read_jsonl
    from evalsets.spec import EVALSETS_DIR
    from gates.comparability_check import id_differences

    rows = [(row["id"], row["bucket"])
            for row in read_jsonl(EVALSETS_DIR / "long_context" / "data.jsonl")]
    spec = load_spec(write_spec(tmp_path, stages=[
        {"name": "kv", "kind": "kv_cache", "engine_flags": {"kv_cache_dtype": "fp8"}}],
        evalsets=[{"name": "long_context", "limit": 80}, {"name": "math", "limit": 200}]))
    baseline, kv = plan(spec)

    def item(who: str, row_id: str, bucket: str, index: int) -> QualityItem:
        right = index % 2 == 0 and not (who == "kv" and bucket == "4k" and index in (0, 4, 8))
        return QualityItem(id=row_id, prompt_hash="h", response="r", score=float(right),
                           output_tokens=5, finish_reason="stop", group=bucket)

    def long_context(who: str, first: int) -> list[QualityItem]:
        seen: dict[str, int] = {}
        out = []
        for row_id, bucket in rows[:first]:
            out.append(item(who, row_id, bucket, seen.setdefault(bucket, 0)))
            seen[bucket] += 1
        return out

    def measured(who: str) -> QualityResult:
        quality = answers("math", [truth(i) for i in range(200)])
        for math_item in quality.tasks["math"].items:
            math_item.output_tokens, math_item.finish_reason = 5, "stop"
        quality.tasks["long_context"] = TaskQuality(task="long_context", metric="acc", value=0.0,
                                                    items=long_context(who, 80))
        return quality

    results = tmp_path / "run"
    StageRecord(name="baseline", kind="baseline", parent=None, axes={}, comparability=asked_as(80),
                quality=measured("baseline")).save(results / "baseline")
    scored: list[tuple[str, str | None, int, int]] = []

    def fake_score(facts, evalset, start, stop, out_dir, tokenizer_dir, template, concurrent,
                   structured_output=False, group=None):
        scored.append((facts.model, group, start, stop))
        of_group = [row for row in rows if group is None or row[1] == group]
        return [item(facts.model, row_id, bucket, start + i)
                for i, (row_id, bucket) in enumerate(of_group[start:stop])]

    @contextlib.contextmanager
    def fake_engine(spec_, stage, log_path, port_offset, kept=None, placement=None):
        yield EngineFacts(base_url="http://b", model=stage.name, command=["vllm"])

    monkeypatch.setattr(adaptive, "_score", fake_score)
    monkeypatch.setattr(adaptive, "engine_beside", fake_engine)
    stage_facts = EngineFacts(base_url="http://s", model="kv", command=["vllm"])
    quality = adaptive.grow_until_decided(kv, measured("kv"), stage_facts, spec, baseline,
                                          results, POLICY, {"long_context": 240, "math": 1040}, 2)
    stop = scored[0][3]  # x2, or the size its discordance says resolves it
    assert scored == [("baseline", "4k", 20, stop), ("kv", "4k", 20, stop)]
    assert 40 <= stop < 120  # not every item the bucket has: a later look was left
    assert quality.looks == 2 and quality.added_items == {"long_context": stop - 20}
    buckets = Counter(bucket for _, bucket in rows)
    assert quality.reach == {"long_context": 240, "math": 800} | {
        f"long_context.{bucket}": n for bucket, n in buckets.items()}
    four_k = [row_id for row_id, bucket in rows if bucket == "4k"]
    assert [i.id for i in quality.tasks["long_context"].items[80:]] == four_k[20:stop]
    more = MoreItems.kept(results / "baseline")
    assert [i.id for i in more.tasks["long_context"]] == four_k[20:stop]
    stored = StageRecord.read(results / "baseline")
    stage = StageRecord(name="kv", kind="kv_cache", parent="baseline", axes={}, quality=quality)
    assert id_differences(stage, stored) == []
