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
    assert (demo.low_users, demo.high_users) == (1, 4)
    assert (demo.prompt_tokens, demo.output_tokens) == (128, 32)
    assert (demo.requests, demo.warmup_requests, demo.duration_s) == (12, 2, None)
    ci = load_profile("ci")
    assert (ci.high_users, ci.prompt_tokens, ci.output_tokens) == (4, 128, 16)
    assert (ci.requests, ci.warmup_requests, ci.duration_s) == (12, 2, None)
    assert ci.slo is not None and demo.slo is not None
    assert ci.levels() == {"low": 1, "high": 4}
    # Timed stages run against their reference in short interleaved rounds.
    assert (ci.rounds, ci.round_requests, ci.round_warmup_requests) == (3, 6, 1)
    assert all(load_profile(name).rounds >= 3 for name in bundled_profiles())


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
        ("rounds: 2", r"field 'rounds': .*greater than or equal to 3"),
        ("round_requests: 1", r"field 'round_requests': .*greater than or equal to 2"),
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
    text = "\n".join(line for line in GOOD.splitlines() if not line.startswith("high_users"))
    with pytest.raises(SpecError, match=r"field 'high_users': Field required"):
        load_profile(write(tmp_path, text))


def test_duration_or_request_count_but_not_both(tmp_path):
    text = "\n".join(line for line in GOOD.splitlines() if not line.startswith("duration_s"))
    with pytest.raises(SpecError, match=r"set exactly one of duration_s .* or requests"):
        load_profile(write(tmp_path, text))
    with pytest.raises(SpecError, match=r"set exactly one of duration_s"):
        load_profile(write(tmp_path, GOOD + "requests: 10\n"))
    counted = load_profile(write(tmp_path, text + "\nrequests: 10\nwarmup_requests: 2\n"))
    assert (counted.requests, counted.warmup_requests, counted.duration_s) == (10, 2, None)


def test_new_fields_default_to_a_short_single_process_run(tmp_path):
    profile = load_profile(write(tmp_path, GOOD))
    assert (profile.repeats, profile.workers, profile.slo) == (1, 0, None)
    assert profile.capacity.enabled is False


def test_slo_capacity_repeats_and_workers_load(tmp_path):
    text = GOOD + (
        "repeats: 3\nworkers: 2\nslo: {ttft_ms: 500, tpot_ms: 80}\n"
        "capacity: {enabled: true, min_rate: 0.5, max_rate: 4, iterations: 3, duration_s: 10}\n"
    )
    profile = load_profile(write(tmp_path, text))
    assert (profile.slo.ttft_ms, profile.slo.tpot_ms) == (500, 80)
    assert (profile.capacity.min_rate, profile.capacity.max_rate, profile.capacity.target) == (0.5, 4, 0.99)
    assert (profile.repeats, profile.workers) == (3, 2)


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ("slo: {}\n", r"slo: an SLO needs ttft_ms, tpot_ms or both"),
        ("slo: {ttft: 100}\n", r"unknown field 'slo.ttft'; did you mean 'ttft_ms'"),
        ("slo: {ttft_ms: -1}\n", r"field 'slo.ttft_ms': .*greater than 0"),
        ("capacity: {enabled: true}\n", r"capacity.enabled needs an slo"),
        ("capacity: {min_rate: 4, max_rate: 2}\n", r"capacity: max_rate \(2.0\) must be > min_rate"),
        ("capacity: {target: 1.5}\n", r"field 'capacity.target': .*less than or equal to 1"),
        ("repeats: 0\n", r"field 'repeats': .*greater than or equal to 1"),
        ("workers: -1\n", r"field 'workers': .*greater than or equal to 0"),
    ],
)
def test_bad_new_fields_are_named(tmp_path, extra, expected):
    with pytest.raises(SpecError, match=expected):
        load_profile(write(tmp_path, GOOD + extra))


def test_distributed_runs_need_a_duration(tmp_path):
    text = "\n".join(line for line in GOOD.splitlines() if not line.startswith("duration_s"))
    with pytest.raises(SpecError, match=r"distributed mode \(workers: 2\) needs duration_s"):
        load_profile(write(tmp_path, text + "\nrequests: 10\nworkers: 2\n"))


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
