"""The one YAML reader: repeated keys, bad encodings and bad syntax are SpecErrors naming the file."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from infra.errors import SpecError
from infra.yamlfile import load_model, read_yaml


def test_a_second_key_is_refused_with_file_line_and_key(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_text("candidate: demo\nstages: [a]\nload_profile: ci\nstages: [b]\n")
    with pytest.raises(SpecError) as raised:
        read_yaml(path)
    assert str(raised.value) == f"{path}: duplicate key 'stages' at line 4 (first at line 2)"


def test_a_repeat_inside_a_nested_mapping_is_refused(tmp_path):
    path = tmp_path / "policy.yaml"
    path.write_text("quality:\n  margin: 1\n  power: 0.8\n  margin: 2\n")
    with pytest.raises(SpecError, match=r"policy\.yaml: duplicate key 'margin' at line 4"):
        read_yaml(path)


def test_the_same_key_in_sibling_mappings_is_fine_and_merge_keys_may_be_overridden(tmp_path):
    path = tmp_path / "profile.yaml"
    path.write_text("base: &b {users: 1, seconds: 5}\nlow:\n  <<: *b\n  users: 2\n"
                    "high: {users: 8}\n")
    assert read_yaml(path) == {"base": {"users": 1, "seconds": 5},
                               "low": {"users": 2, "seconds": 5}, "high": {"users": 8}}


def test_a_file_that_is_not_utf8_is_one_line_naming_it(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_bytes("candidate: d\xe9mo\n".encode("latin-1"))
    with pytest.raises(SpecError) as raised:
        read_yaml(path)
    message = str(raised.value)
    assert message.startswith(f"{path}: not UTF-8") and "0xe9" in message and "\n" not in message


def test_load_model_refuses_duplicates_before_validating(tmp_path):
    class Small(BaseModel):
        name: str

    path = tmp_path / "small.yaml"
    path.write_text("name: a\nname: b\n")
    with pytest.raises(SpecError, match="duplicate key 'name' at line 2"):
        load_model(path, Small)
    path.write_text("name: a\n")
    assert load_model(path, Small).name == "a"


def test_bad_syntax_and_a_missing_file_name_the_file(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("a: [1, 2\n")
    with pytest.raises(SpecError, match=r"bad\.yaml: not valid YAML"):
        read_yaml(path)
    with pytest.raises(SpecError, match=r"gone\.yaml: file not found"):
        read_yaml(tmp_path / "gone.yaml")
