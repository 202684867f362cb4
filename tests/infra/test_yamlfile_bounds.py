"""The YAML reader refuses documents that cannot be meant before building anything from them:
aliases that expand beyond reason, aliases of themselves, nesting too deep to read."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ConfigDict

from infra.errors import SpecError
from infra.yamlfile import MAX_ALIAS_EXPANSION, load_model, parse_yaml


def laughs(levels: int, copies: int = 9) -> str:
    lines = [f"l0: &l0 [{', '.join(['lol'] * copies)}]"]
    lines += [f"l{n}: &l{n} [{', '.join([f'*l{n - 1}'] * copies)}]" for n in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


def test_a_billion_laughs_is_one_line_not_a_memory_error():
    with pytest.raises(SpecError) as raised:
        parse_yaml(laughs(9), "spec.yaml")
    message = str(raised.value)
    assert message.startswith("spec.yaml: the aliases under line ") and "\n" not in message
    assert f"more than {MAX_ALIAS_EXPANSION:,} nodes (a 'billion laughs')" in message


def test_merge_keys_that_multiply_are_refused_too():
    text = "a0: &a0 {k: v}\n" + "".join(
        f"a{n}: &a{n} {{<<: [{', '.join([f'*a{n - 1}'] * 9)}]}}\n" for n in range(1, 9))
    with pytest.raises(SpecError, match="billion laughs"):
        parse_yaml(text, "policy.yaml")


def test_anchors_used_for_reuse_and_big_documents_without_aliases_load():
    assert parse_yaml(laughs(2))["l2"][8][8][8] == "lol"  # 729 leaves: ordinary reuse
    size = MAX_ALIAS_EXPANSION + 1_000  # written out, however long: no alias multiplies it
    assert len(parse_yaml("[" + ", ".join(["1"] * size) + "]")) == size


def test_an_alias_of_itself_and_endless_nesting_are_one_line():
    with pytest.raises(SpecError, match=r"x\.yaml: the node at line 1 holds an alias of itself"):
        parse_yaml("a: &a [1, *a]\n", "x.yaml")
    with pytest.raises(SpecError, match=r"x\.yaml: nested too deeply to read"):
        parse_yaml("[" * 50_000 + "]" * 50_000, "x.yaml")


def test_an_infinite_number_is_named_with_its_field_and_what_to_do(tmp_path):
    class Limits(BaseModel):
        model_config = ConfigDict(allow_inf_nan=False)
        max_kl: float

    path = tmp_path / "policy.yaml"
    for text, shown in (("max_kl: .inf\n", "inf"), ("max_kl: .nan\n", "nan"), ("max_kl: -.inf\n", "-inf")):
        path.write_text(text)
        with pytest.raises(SpecError) as raised:
            load_model(path, Limits)
        assert str(raised.value).startswith(
            f"{path}: field 'max_kl': Input should be a finite number (got {shown}); give a finite value")


def test_an_enum_typo_is_named_with_the_closest_choice(tmp_path):
    from load.profile import load_profile

    path = tmp_path / "profile.yaml"
    path.write_text("high_users: 2\nprompt_tokens: 8\noutput_tokens: 4\nrequests: 3\n"
                    "prompts: {source: evalsets, name: math}\n")
    with pytest.raises(SpecError) as raised:
        load_profile(path)
    assert str(raised.value) == (f"{path}: field 'prompts.source': 'evalsets' is not one of its "
                                 "choices; did you mean 'evalset'? (valid: evalset, file, random)")


def test_a_misspelt_kind_of_a_tagged_union_is_named_at_its_tag():
    from pydantic import ValidationError

    from evalsets.spec import EvalSetSpec
    from infra.yamlfile import describe_validation_error

    with pytest.raises(ValidationError) as raised:
        EvalSetSpec.model_validate({"name": "x", "path": "x.jsonl", "scorer": {"kind": "numerc"}})
    assert describe_validation_error("spec.yaml", raised.value, EvalSetSpec) == (
        "spec.yaml: field 'scorer.kind': 'numerc' is not one of its choices; did you mean "
        "'numeric'? (valid: choice, code, exact, instructions, json, numeric, regex)")
