"""Comparability: a stage asked differently from the baseline fails closed, the field named."""

from __future__ import annotations

import json

import pytest

from evalsets.results import QualityItem
from gates.comparability import (
    NOT_APPLIED,
    Comparability,
    SetSettings,
    chat_template_hash,
    generation_settings,
    profile_hash,
    tokenizer_hash,
)
from gates.decide import decide, load_records
from gates.policy import GatePolicy
from gates.record import RunManifest
from infra.errors import QuantgateError
from tests.gates.records import record

SCORES = [1.0] * 30 + [0.0] * 30
MATH = {"max_gen_toks": 256, "until": ["Question:"], "temperature": 0.0, "do_sample": False}


def asked(**changes) -> Comparability:
    fields = {"chat_template": "a" * 16, "tokenizer": "b" * 16,
              "sets": {"math": SetSettings(generation=dict(MATH), items=len(SCORES))},
              "load_profile": "c" * 16, "load_prompts": "random token ids, 128 per prompt"}
    return Comparability(**(fields | changes))


def judged(stage_asked: Comparability | None, base_asked: Comparability | None = None,
           stage_scores=SCORES):
    baseline = record("baseline", None, SCORES)
    stage = record("w4", "baseline", stage_scores)
    baseline.comparability = base_asked if base_asked is not None else asked()
    stage.comparability = stage_asked
    verdict = decide("c", [baseline, stage], GatePolicy())
    check = next(c for c in verdict.stages[1].checks if c.rule == "comparability")
    return verdict, check


def test_stages_asked_alike_pass_and_the_reason_shows_the_hashes():
    verdict, check = judged(asked())
    assert verdict.decision == "go" and check.passed and check.status == "pass"
    assert "chat template aaaaaaaaaaaaaaaa" in check.reason and "tokenizer bbbbbbbbbbbbbbbb" in check.reason


@pytest.mark.parametrize(("changes", "named"), [
    ({"chat_template": "d" * 16}, f"chat template {'d' * 16} vs baseline {'a' * 16}"),
    ({"tokenizer": "e" * 16}, f"tokenizer {'e' * 16} vs baseline {'b' * 16}"),
    ({"sets": {"math": SetSettings(generation=MATH | {"max_gen_toks": 64}, items=60)}},
     "set math max_gen_toks 64 vs baseline 256"),
    ({"sets": {"math": SetSettings(generation=MATH | {"until": ["\n"]}, items=60)}},
     'set math until ["\\n"] vs baseline ["Question:"]'),
    ({"sets": {"math": SetSettings(generation=MATH | {"temperature": 0.7, "do_sample": True},
                                   items=60)}},
     "set math do_sample True vs baseline False; set math temperature 0.7 vs baseline 0.0"),
    ({"sets": {"math": SetSettings(generation=MATH, items=40)}},
     "set math first-look items 40 vs baseline 60"),
    ({"load_profile": "f" * 16, "load_prompts": "eval set math"},
     f"load profile {'f' * 16} (eval set math) vs baseline {'c' * 16}"),
])
def test_each_difference_fails_closed_with_the_field_named(changes, named):
    verdict, check = judged(asked(**changes))
    assert verdict.decision == "rollback" and verdict.exit_code == 1
    assert not check.passed and named in check.reason
    assert f"w4: comparability: {check.reason}" in verdict.reasons
    assert verdict.accepted_stage == "baseline"


def test_other_item_ids_are_named_with_the_first_that_differs():
    baseline = record("baseline", None, SCORES)
    stage = record("w4", "baseline", SCORES)
    stage.quality.tasks["math"].items[3].id = "other"
    verdict = decide("c", [baseline, stage], GatePolicy())
    assert verdict.decision == "rollback"
    assert ("w4: comparability: set math item ids differ from the baseline's at item 4 "
            "('other' vs '3')") in verdict.reasons


def test_a_set_missing_on_one_side_is_named():
    baseline = record("baseline", None, SCORES)
    stage = record("w4", "baseline", SCORES)
    stage.quality.tasks["code"] = stage.quality.tasks["math"].model_copy(update={"task": "code"})
    verdict = decide("c", [baseline, stage], GatePolicy())
    assert "w4: comparability: set code was not measured on the baseline" in verdict.reasons


def _grown(stage_record, extra: int) -> None:
    task = stage_record.quality.tasks["math"]
    start = len(task.items)
    task.items += [QualityItem(id=str(start + i), prompt_hash="h", response="r", score=1.0,
                               output_tokens=40, finish_reason="stop") for i in range(extra)]


def test_a_baseline_grown_by_adaptive_looks_is_not_a_difference():
    # A later stage's looks grew the baseline to 80 items; this stage stopped at its first 60.
    baseline = record("baseline", None, SCORES)
    _grown(baseline, 20)
    stage = record("w4", "baseline", SCORES)
    baseline.comparability = stage.comparability = asked()
    check = next(c for c in decide("c", [baseline, stage], GatePolicy()).stages[1].checks
                 if c.rule == "comparability")
    assert check.passed and check.applicable


def test_items_the_baseline_never_scored_are_named():
    baseline = record("baseline", None, SCORES)
    stage = record("w4", "baseline", SCORES)
    _grown(stage, 5)
    baseline.comparability = stage.comparability = asked()
    verdict = decide("c", [baseline, stage], GatePolicy())
    assert ("w4: comparability: set math 65 items vs baseline 60 (items the baseline never "
            "scored)") in verdict.reasons


def test_a_record_without_the_comparability_its_layout_carries_is_refused(tmp_path):
    # Every record of this layout carries it (null where nothing was measured): one without it
    # was edited, and judging it by a default would skip the rule unseen.
    for name in ("baseline", "w4"):
        record(name, None if name == "baseline" else "baseline", SCORES).save(tmp_path / name)
    RunManifest(candidate="c", stages=["baseline", "w4"]).save(tmp_path)
    stored = json.loads((tmp_path / "w4" / "stage.json").read_text())
    stored.pop("comparability")
    (tmp_path / "w4" / "stage.json").write_text(json.dumps(stored))
    with pytest.raises(QuantgateError, match="without 'comparability'"):
        load_records(tmp_path)


def test_one_side_recorded_the_other_not_still_compares_ids_and_says_which():
    verdict, check = judged(None)
    assert verdict.decision == "go" and check.status == "n/a" and "for the stage (" in check.reason
    _, check = judged(None, stage_scores=SCORES[:-1] + [1.0])
    assert check.status == "n/a"  # scores are not ids: the accuracy rules judge them


def test_chat_template_hash_is_of_the_template_the_server_applies(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages }}"}))
    from_config = chat_template_hash(tmp_path)
    (tmp_path / "chat_template.jinja").write_text("{% for m in messages %}{{ m }}{% endfor %}")
    from_jinja = chat_template_hash(tmp_path)
    assert len(from_config) == len(from_jinja) == 16 and from_config != from_jinja
    assert chat_template_hash(tmp_path, applied=False) == NOT_APPLIED
    assert chat_template_hash(tmp_path / "missing").startswith("none")


def test_tokenizer_hash_changes_with_any_tokenizer_file(tmp_path):
    (tmp_path / "tokenizer.json").write_text('{"model": {"vocab": {"a": 0}}}')
    first = tokenizer_hash(tmp_path)
    (tmp_path / "merges.txt").write_text("a b\n")
    assert tokenizer_hash(tmp_path) != first
    assert tokenizer_hash(tmp_path / "missing").startswith("none")


def test_generation_settings_are_those_sent_with_lm_evals_defaults():
    sent = generation_settings({"generation_kwargs": {"until": "Q:", "max_gen_toks": 64, "top_p": 0.9}})
    assert sent == {"max_gen_toks": 64, "until": ["Q:"], "temperature": 0.0, "do_sample": False,
                    "top_p": 0.9}
    assert generation_settings({})["max_gen_toks"] == 256


def test_profile_hash_covers_the_prompt_source_content():
    profile = {"high_users": 4, "prompts": {"source": "file", "path": "/p.jsonl"}}
    assert profile_hash(profile, "x") != profile_hash(profile, "y")
    assert profile_hash(profile, "x") == profile_hash(dict(profile), "x")


def test_the_flow_records_what_the_stage_was_asked(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from flows.stage import asked as recorded
    from load.profile import load_profile
    from tests.flows.test_cache import spec

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    the_spec = spec(tmp_path)
    checkpoint = the_spec.baseline.checkpoint
    (checkpoint / "chat_template.jinja").write_text("{{ messages }}")
    (checkpoint / "tokenizer.json").write_text("{}")
    grown = record("w4", "baseline", SCORES)
    _grown(grown, 10)
    grown.quality.added_items = {"math": 10}
    prepared = SimpleNamespace(spec=the_spec, profile=load_profile("ci"), load_prompts=None)
    comparability = recorded(SimpleNamespace(checkpoint=checkpoint), prepared, grown.quality)
    assert comparability.chat_template == chat_template_hash(checkpoint)
    assert comparability.tokenizer == tokenizer_hash(checkpoint)
    # As sent: evalsets/math/task.yaml's settings; the first look only (the 10 grown items not).
    assert comparability.sets["math"] == SetSettings(
        generation={"max_gen_toks": 96, "until": ["Question:", "<|im_end|>", "<|endoftext|>"],
                    "temperature": 0.0, "do_sample": False}, items=len(SCORES))
    assert comparability.load_prompts == "random token ids, 128 per prompt"
    other = SimpleNamespace(spec=the_spec, profile=load_profile("demo"), load_prompts=None)
    assert recorded(SimpleNamespace(checkpoint=checkpoint), other, None).load_profile != \
        comparability.load_profile


def test_the_report_sign_off_shows_the_hashes_and_the_load_section_the_prompt_source(tmp_path):
    from gates.report import write_report
    from tests.gates.records import chain

    records = chain()
    source = "eval set math: 120 prompts of 12-80 tokens (median 31)"
    for stage in records:
        stage.comparability = asked(sets={"math": SetSettings(generation=dict(MATH), items=120)},
                                    load_prompts=source)
    records[2].comparability = records[2].comparability.model_copy(update={"tokenizer": "9" * 16})
    verdict = decide("demo", records, GatePolicy())
    assert f"a8: comparability: tokenizer {'9' * 16} vs baseline {'b' * 16}" in verdict.reasons
    paths = write_report(verdict, records, tmp_path / "report")
    md, html = paths["md"].read_text(), paths["html"].read_text()
    sign_off = md[md.index("## Sign-off"):]
    assert f"| Asked alike: Chat template | {'a' * 16} (every stage) |" in sign_off
    assert f"| Asked alike: Tokenizer | {'b' * 16} (baseline, w8); {'9' * 16} (a8) |" in sign_off
    assert f"| Asked alike: Load profile | {'c' * 16} (every stage) |" in sign_off
    assert ('| Asked alike: Eval set math | max_gen_toks 256, until ["Question:"], temperature '
            '0.0, do_sample false, 120 first-look items (every stage) |') in sign_off
    latency = md[md.index("## Latency"):md.index("## Sign-off")]
    assert f"Load prompts: {source} (every stage)." in latency
    assert 'id="comparability"' in html and f"Tokenizer: <code>{'b' * 16} (baseline, w8)" in html
    assert f"<strong>Load prompts</strong>: {source} (every stage)." in html
