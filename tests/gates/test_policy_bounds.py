"""A policy the spec's eval sets make unusable is refused at validate, in one line naming the
policy file, the field, its value and the value that fits."""

from __future__ import annotations

import pytest
import yaml

from gates.policy import DEFAULT_POLICY, GatePolicy, load_policy
from infra.errors import SpecError


def written(tmp_path, section: str = "quality", **values) -> str:
    data = yaml.safe_load(DEFAULT_POLICY.read_text())
    target = data[section]
    if section == "tolerances":
        target = target["8bit"]
    target.update(values)
    (tmp_path / "policy.yaml").write_text(yaml.safe_dump(data))
    return str(tmp_path / "policy.yaml")


def test_more_resampled_values_than_the_box_holds_name_the_resamples_that_fit(tmp_path):
    source = written(tmp_path, bootstrap_resamples=100_000)
    policy = load_policy(source)
    with pytest.raises(SpecError) as raised:
        policy.check_min_items({"mmlu": 14_042, "math": 1_040}, source)
    assert str(raised.value) == (
        f"gate policy {source}: quality.bootstrap_resamples (100,000) x 15,082 pooled eval items "
        "= 1,508,200,000 resampled values, over 250,000,000 (about 22 GiB at once); lower "
        "quality.bootstrap_resamples to at most 16,576")
    policy.check_min_items({"math": 1_040, "business": 300}, source)  # 134 million: fits
    GatePolicy().check_min_items({"mmlu": 14_042, "math": 1_040}, "default")  # 2,000 resamples


def test_sets_too_large_for_even_the_fewest_resamples_say_so():
    with pytest.raises(SpecError, match=r"\(about 75 GiB at once\); give the eval sets a limit: "
                                        r"even 200 resamples \(the fewest\) fit at most "
                                        r"1,250,000 items$"):
        GatePolicy().check_min_items({"huge": 2_500_000}, "default")


@pytest.mark.parametrize(("quality", "expected"), [
    ({"seed": -1}, "field 'quality.seed': Input should be greater than or equal to 0 (got -1)"),
    ({"bootstrap_resamples": 100_000_000}, "field 'quality.bootstrap_resamples': at most 100,000"),
    ({"power": float("nan")}, "field 'quality.power': Input should be a finite number (got nan)"),
])
def test_values_no_one_means_are_refused_where_the_policy_is_read(tmp_path, quality, expected):
    source = written(tmp_path, **quality)
    with pytest.raises(SpecError) as raised:
        load_policy(source)
    assert str(raised.value).startswith(f"{source}: {expected}")
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize(("section", "values", "expected"), [
    ("tolerances", {"max_kl": 1e9}, "field 'tolerances.8bit.max_kl': at most 1.0 (a nat per token: "
     "a larger one passes whatever a stage does, which switches the rule off unseen); give a "
     "smaller value (got 1000000000.0)"),
    ("tolerances", {"accuracy_margin": 0.9}, "field 'tolerances.8bit.accuracy_margin': at most 0.5"),
    ("tolerances", {"min_top1": 0.01}, "field 'tolerances.8bit.min_top1': Input should be greater "
     "than or equal to 0.5 (got 0.01)"),
    ("quality", {"alpha": 0.9}, "field 'quality.alpha': at most 0.2"),
    ("load", {"max_error_rate": 1}, "field 'load.max_error_rate': at most 0.5 (half the requests"),
    ("length", {"max_change": 0.99}, "field 'length.max_change': at most 0.5"),
    ("length", {"max_length_finish_increase": 1}, "field 'length.max_length_finish_increase': at "
     "most 0.5"),
])
def test_a_finite_limit_that_passes_every_stage_is_refused(tmp_path, section, values, expected):
    # A rule is relaxed by its own setting (required: false), never by a limit nothing exceeds.
    source = written(tmp_path, section, **values)
    with pytest.raises(SpecError) as raised:
        load_policy(source)
    assert str(raised.value).startswith(f"{source}: {expected}")


def test_a_policy_extends_another_naming_only_what_it_changes(tmp_path):
    """A team's file names its changes on top of 'default' (or another file, relative to it):
    sections merge key by key, so the untouched limits stay the default's."""
    (tmp_path / "team.yaml").write_text(
        "extends: default\ndivergence: {corpus_tokens: 12000}\ntolerances: {8bit: {max_kl: 0.05}}\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "strict.yaml").write_text("extends: ../team.yaml\nquality: {power: 0.9}\n")
    policy, default = load_policy("strict.yaml", tmp_path / "sub"), GatePolicy()
    assert policy.divergence.corpus_tokens == 12000 and policy.quality.power == 0.9
    assert policy.tolerances["8bit"].max_kl == 0.05
    assert policy.tolerances["8bit"].min_top1 == default.tolerances["8bit"].min_top1
    assert policy.divergence.block_tokens == default.divergence.block_tokens


@pytest.mark.parametrize(("text", "expected"), [
    ("extends: loop.yaml\n", r"`extends` goes round in a circle"),
    ("extends: [default]\n", r"`extends` names a policy \('default' or a path\), got \['default'\]"),
    ("extends: missing.yaml\n", r"gate policy 'missing.yaml' not found"),
    ("extends: default\nquality: {confidenc: 0.9}\n", r"loop.yaml: .*quality.confidenc"),
])
def test_a_bad_extends_is_one_line_naming_the_file(tmp_path, text, expected):
    (tmp_path / "loop.yaml").write_text(text)
    with pytest.raises(SpecError, match=expected) as raised:
        load_policy(str(tmp_path / "loop.yaml"))
    assert "\n" not in str(raised.value)
