"""Eval-set specs name only known sets, and the registry finds sets as folders."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from evalsets.spec import EvalSetSpec, get_evalset, registry
from infra.errors import SpecError


def test_math_is_registered_with_its_task_file():
    sets = registry()
    assert "math" in sets
    assert sets["math"].task_yaml.is_file()


def test_unknown_name_lists_valid_names():
    with pytest.raises(ValidationError) as caught:
        EvalSetSpec(name="maths")
    message = str(caught.value)
    assert "'maths'" in message
    assert "did you mean 'math'" in message


def test_unrelated_name_lists_all_valid_names():
    with pytest.raises(ValidationError, match=r"valid: .*long_context, math"):
        EvalSetSpec(name="legal-qa")


def test_get_evalset_raises_spec_error():
    with pytest.raises(SpecError, match="valid: .*long_context, math"):
        get_evalset("nope")


@pytest.mark.parametrize("field", ["limit", "max_gen_toks"])
def test_limits_must_be_positive(field):
    with pytest.raises(ValidationError, match=field):
        EvalSetSpec(name="math", **{field: 0})


def test_unknown_fields_are_refused():
    with pytest.raises(ValidationError, match="limt"):
        EvalSetSpec(name="math", limt=5)


def test_new_folder_is_a_new_set(tmp_path):
    (tmp_path / "business").mkdir()
    (tmp_path / "business" / "task.yaml").write_text("task: qg_business\n")
    (tmp_path / "notes").mkdir()
    assert list(registry(tmp_path)) == ["business"]


def test_long_context_is_registered_and_groups_must_be_non_empty():
    assert "long_context" in registry()
    assert EvalSetSpec(name="long_context", groups=["512"]).groups == ["512"]
    with pytest.raises(ValidationError, match="groups"):
        EvalSetSpec(name="long_context", groups=[])
