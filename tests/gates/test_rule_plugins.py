"""Gate rules are plug-ins: a rule added as one module (its check, its settings, its report cell)
is judged, gated and shown without touching the checks, the report or the templates."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, Field

from gates import rules
from gates.decide import decide
from gates.policy import GatePolicy
from gates.report import write_report
from gates.rules import Column, Context, Rule, cell, find
from gates.verdict import Check, judged
from tests.gates.records import chain


class EmptyAnswers(BaseModel):
    max_increase: float = Field(0.05, ge=0, le=1)


class NoEmptyAnswers(Rule):
    """What a team would add: the share of empty answers may not rise against the parent."""

    name = "empty_answers"
    columns = (Column("empty", "empty answers", 45),)
    settings = EmptyAnswers

    def checks(self, context: Context) -> list[Check]:
        def share(record):
            items = [i for t in record.quality.tasks.values() for i in t.items]
            return sum(not i.response.strip() for i in items) / len(items)

        rise = share(context.stage) - share(context.parent)
        limit = self.options(context.policy).max_increase
        return [judged("empty_answers", "pass" if rise <= limit else "fail", True,
                       f"empty answers {rise:+.1%} vs the parent (limit +{limit:.0%})",
                       value=rise, limit=limit)]

    def cells(self, stage, set_names):
        check = find(stage, "empty_answers")
        return {"empty": cell(check, f"{check.value:+.1%}" if check else "-")}


@pytest.fixture
def plugged(monkeypatch):
    rules.registered()  # the built-in ones first, in their order
    monkeypatch.setitem(rules._REGISTRY, NoEmptyAnswers.name, NoEmptyAnswers())


def test_the_built_in_rules_are_registered_in_check_order():
    assert [r.name for r in rules.registered()] == [
        "comparability", "quality", "divergence", "perplexity", "latency", "length", "engine"]
    assert [c.key for c in rules.columns()] == ["kl", "top1", "perplexity", "length", "tpot",
                                                "bought"]


def test_a_rule_added_as_one_module_is_judged_and_shown(plugged, tmp_path):
    records = chain()
    records[2].quality.tasks["math"].items[0].response = ""  # a8 answers one item with nothing
    strict = GatePolicy.model_validate({"rules": {"empty_answers": {"max_increase": 0.0}}})
    verdict = decide("demo", records, strict)
    check = next(c for c in verdict.stages[2].checks if c.rule == "empty_answers")
    assert check.status == "fail" and verdict.decision == "rollback"
    # After the built-in gated rules, before what the stage bought (shown last).
    order = [c.rule for c in decide("demo", records, GatePolicy()).stages[2].checks]
    assert order[-2:] == ["empty_answers", "engine"]
    md = write_report(verdict, records, tmp_path)["md"].read_text()
    header = next(line for line in md.splitlines() if line.startswith("| stage |"))
    assert header.index("length") < header.index("empty answers") < header.index("TPOT")
    assert "(fail)" in next(line for line in md.splitlines() if line.startswith("| a8 |"))


def test_a_plug_in_s_settings_are_checked_by_name_and_field(plugged):
    from infra.errors import SpecError

    wrong = GatePolicy.model_validate({"rules": {"empty_answers": {"max_increase": 2}}})
    with pytest.raises(SpecError, match=r"team.yaml: rules.empty_answers.max_increase: Input "
                                        r"should be less than or equal to 1"):
        rules.check_settings(wrong, "team.yaml")
    with pytest.raises(SpecError, match=r"rules.empty_answer: .*did you mean 'empty_answers'"):
        rules.check_settings(GatePolicy.model_validate({"rules": {"empty_answer": {}}}))
    rules.check_settings(GatePolicy.model_validate({"rules": {"empty_answers": {}}}))
    # A policy without plug-in settings dumps as before (its hash in stored verdicts holds).
    assert "rules" not in GatePolicy().model_dump()
