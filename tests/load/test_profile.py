"""Load profiles: the bundled ones load, and a bad one names its file and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.errors import SpecError
from load.profile import LoadProfile, bundled_profiles, load_profile, profile_path

GOOD = """\
low_users: 1
high_users: 4
prompt_tokens: 128
output_tokens: 32
warmup_s: 3
duration_s: 15
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "x.yaml"
    path.write_text(text)
    return path


def test_bundled_profiles_have_the_documented_shape():
    assert {"ci", "demo"} <= set(bundled_profiles())
    demo = load_profile("demo")
    assert (demo.low_users, demo.high_users) == (1, 8)
    assert (demo.prompt_tokens, demo.output_tokens) == (256, 64)
    assert (demo.warmup_s, demo.duration_s) == (5, 30)
    ci = load_profile("ci")
    assert (ci.high_users, ci.prompt_tokens, ci.output_tokens) == (4, 128, 32)
    assert (ci.warmup_s, ci.duration_s) == (3, 15)
    assert ci.levels() == {"low": 1, "high": 4}


def test_a_path_loads_and_defaults_fill_in(tmp_path):
    profile = load_profile(write(tmp_path, GOOD))
    assert profile.max_error_rate == 0.01 and profile.request_timeout_s > 0
    assert profile_path(str(tmp_path / "x.yaml")) == tmp_path / "x.yaml"


def test_every_field_has_a_description():
    assert all(field.description for field in LoadProfile.model_fields.values())


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ("high_users: 0", r"x\.yaml: field 'high_users': .*greater than or equal to 1"),
        ("output_tokens: 1", r"field 'output_tokens': .*greater than or equal to 2"),
        ("duration_s: many", r"field 'duration_s': .*number"),
        ("max_error_rate: 1.5", r"field 'max_error_rate': .*less than or equal to 1"),
        ("hihg_users: 4", r"unknown field 'hihg_users'; did you mean 'high_users'"),
        ("low_users: 5", r"high_users \(4\) must be >= low_users \(5\)"),
    ],
)
def test_bad_values_name_the_file_and_the_field(tmp_path, change, expected):
    key = change.split(":")[0]
    lines = [line for line in GOOD.splitlines() if not line.startswith(key + ":")]
    path = write(tmp_path, "\n".join([*lines, change]) + "\n")
    with pytest.raises(SpecError, match=expected) as caught:
        load_profile(path)
    assert str(path) in str(caught.value)


def test_missing_required_field(tmp_path):
    text = "\n".join(line for line in GOOD.splitlines() if not line.startswith("duration_s"))
    with pytest.raises(SpecError, match=r"field 'duration_s': required"):
        load_profile(write(tmp_path, text))


def test_not_a_mapping_and_bad_yaml(tmp_path):
    with pytest.raises(SpecError, match="expected a mapping"):
        load_profile(write(tmp_path, "- 1\n- 2\n"))
    with pytest.raises(SpecError, match="not valid YAML"):
        load_profile(write(tmp_path, "a: [1,\n"))


def test_unknown_names_and_missing_files():
    with pytest.raises(SpecError, match=r"unknown load profile 'dmeo'; did you mean 'demo'"):
        profile_path("dmeo")
    with pytest.raises(SpecError, match="not found"):
        profile_path("nowhere/p.yaml")
