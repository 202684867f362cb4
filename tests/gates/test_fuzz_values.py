"""Property-based fuzzing (Hypothesis) of the values that cannot be meant, where they are read.

Gate policies and load profiles with numbers no one means (infinite, NaN, 10^18, negative) and
eval rows with hostile patterns, references and nesting: each is read into a valid object whose
numbers are all usable, or refused in one line (a QuantgateError without a newline), never another
exception, and within a bound (a hang fails the example instead of the suite).
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evalsets.patterns import regex_problem
from evalsets.scorers import NumericScorer, RegexScorer
from gates.policy import (
    MAX_KL,
    MAX_MARGIN,
    MAX_RESAMPLED_VALUES,
    MAX_SHARE,
    MIN_TOP1,
    load_policy,
)
from infra.errors import QuantgateError
from infra.values import MAX_SECONDS, MAX_SOAK_SECONDS
from load.profile import load_profile
from tests.flows.test_fuzz_hostile import one_line_or_valid

REPO = Path(__file__).parents[2]
POLICY = yaml.safe_load((REPO / "gates" / "policy.yaml").read_text())
PROFILE = yaml.safe_load((REPO / "load" / "profiles" / "demo.yaml").read_text())
FAST = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

extreme = st.sampled_from([math.inf, -math.inf, math.nan, 1e308, -1e308, 10**18, -(10**18),
                           2**63, -1, 0, 1e-320, 10**9, 100_000, 100_001, 86_401, 0.5])


def number_paths(tree, prefix=()):
    """Paths of every number (not bool) in a tree of dicts and lists."""
    if isinstance(tree, dict):
        return [p for key, value in tree.items() for p in number_paths(value, (*prefix, key))]
    if isinstance(tree, list):
        return [p for i, value in enumerate(tree) for p in number_paths(value, (*prefix, i))]
    return [prefix] if isinstance(tree, (int, float)) and not isinstance(tree, bool) else []


@st.composite
def extremes_in(draw, tree):
    """`tree` with one to three of its numbers replaced by values nobody means."""
    tree = copy.deepcopy(tree)
    paths = number_paths(tree)
    for _ in range(draw(st.integers(1, 3))):
        *parents, last = draw(st.sampled_from(paths))
        node = tree
        for part in parents:
            node = node[part]
        node[last] = draw(extreme)
    return tree


def finite_numbers(tree) -> bool:
    if isinstance(tree, dict):
        return all(finite_numbers(value) for value in tree.values())
    if isinstance(tree, list):
        return all(finite_numbers(value) for value in tree)
    return not isinstance(tree, float) or math.isfinite(tree)


@FAST
@given(policy=extremes_in(POLICY), pools=st.dictionaries(
    st.sampled_from(["math", "business", "mmlu"]), st.sampled_from([1, 20, 1_040, 14_042, 10**7]),
    min_size=1))
def test_policies_with_extreme_numbers_are_one_line_or_usable(tmp_path_factory, policy, pools):
    path = tmp_path_factory.mktemp("policy") / "policy.yaml"
    path.write_text(yaml.safe_dump(policy))
    found = one_line_or_valid(load_policy, str(path))
    if isinstance(found, QuantgateError):
        assert str(path) in str(found), found
        return
    dumped = found.model_dump(mode="json")
    assert finite_numbers(dumped), "an infinite or NaN limit was read"
    q = found.quality
    assert q.seed >= 0 and 200 <= q.bootstrap_resamples <= 100_000
    for tolerance in found.tolerances.values():  # no limit that passes every stage
        assert 0 < tolerance.accuracy_margin <= MAX_MARGIN and 0 < tolerance.max_kl <= MAX_KL
        assert MIN_TOP1 <= tolerance.min_top1 <= 1
    assert found.load.max_error_rate <= MAX_SHARE and found.length.max_change <= MAX_SHARE
    checked = one_line_or_valid(found.check_min_items, pools, str(path))
    if checked is None:  # accepted for these sets: the bootstrap fits and every set can decide
        assert q.bootstrap_resamples * sum(pools.values()) <= MAX_RESAMPLED_VALUES
        assert min(pools.values()) >= q.min_items
    else:
        assert "quality." in str(checked), checked


@FAST
@given(profile=extremes_in(PROFILE), soak=st.booleans())
def test_profiles_with_extreme_numbers_are_one_line_or_bounded(tmp_path_factory, profile, soak):
    path = tmp_path_factory.mktemp("profile") / "profile.yaml"
    path.write_text(yaml.safe_dump(profile | ({"soak": True} if soak else {})))
    found = one_line_or_valid(load_profile, path)
    if isinstance(found, QuantgateError):
        assert str(path) in str(found), found
        return
    assert finite_numbers(found.model_dump(mode="json"))
    assert found.request_timeout_s <= MAX_SECONDS and found.warmup_s <= MAX_SECONDS
    assert (found.duration_s or 0) <= (MAX_SOAK_SECONDS if soak else MAX_SECONDS)
    capacity = found.capacity
    assert capacity.window_s(capacity.min_rate) <= MAX_SECONDS


# Pieces of patterns that backtrack: an alternation whose branches start alike, a repeat that can
# stop where what follows starts, inside a repeat of many rounds.
piece = st.sampled_from(["a", "ab", ".", r"\w", r"\s", "[ab]", "a?", "a*", r"\d+"])
ambiguous = st.one_of(
    st.builds(lambda p: f"(?:{p}|{p}{p})*$", piece),
    st.builds(lambda p: f"(?:{p}|{p})+!", piece),
    st.builds(lambda p, n: f"(?:.*{p}){{{n}}}$", st.sampled_from(["a", "b", r"\w"]),
              st.integers(10, 40)),
    st.builds(lambda n: f"(?:a?){{{n}}}a{{{n}}}", st.integers(10, 40)),
)


@FAST
@given(pattern=ambiguous)
def test_patterns_that_match_one_text_many_ways_are_refused_before_scoring(pattern):
    problem = one_line_or_valid(regex_problem, pattern)
    assert isinstance(problem, str) and "\n" not in problem, pattern
    assert repr(pattern) in problem
    assert RegexScorer(kind="regex", field="pattern").problem({"pattern": pattern})[0] == "pattern"


regex_text = st.text(alphabet="ab(+*?|)[]{},.^$\\dws1-0", max_size=16)


@FAST
@given(pattern=st.one_of(regex_text, ambiguous, st.sampled_from(["(a|aa)*b", "(x|xy)*z", "a++$"])),
       answer=st.sampled_from(["a" * 3000 + "!", "a" * 30, "", "ab " * 500, "1,2,3"]))
def test_a_rows_pattern_is_refused_in_one_line_or_scores_within_its_bound(pattern, answer):
    scorer = RegexScorer(kind="regex", field="pattern")
    problem = one_line_or_valid(scorer.problem, {"pattern": pattern})
    if problem is None:  # accepted at validate: scoring ends, with a score or one line
        found = one_line_or_valid(scorer.score, answer, {"pattern": pattern})
        assert isinstance(found, (float, QuantgateError))
    else:
        field, why = problem
        assert field == "pattern" and "\n" not in why


@FAST
@given(reference=st.one_of(extreme, st.sampled_from(["inf", "-Infinity", "nan", "NaN", "1e999",
                                                      "1,000", "", "x"])),
       tolerance=st.sampled_from([0.0, 0.5, 1e300]))
def test_a_numeric_reference_no_answer_can_miss_is_refused(reference, tolerance):
    scorer = NumericScorer(kind="numeric", field="answer", tolerance=tolerance)
    row = {"answer": reference}
    if scorer.problem(row) is not None:
        return
    number = float(str(reference).replace(",", ""))
    assert math.isfinite(number)
    assert scorer.score("no number at all", row) == 0.0
    far = -number - 3 * max(abs(number), 1.0)  # the other sign, further than any rounding
    assert scorer.score(f"{far!r}", row) == 0.0 or tolerance >= 1e300


@FAST
@given(tolerance=st.sampled_from([0.0, 0.4, 0.5, 19.5, 1e300]), relative=st.sampled_from([0, 0.01, 1]))
def test_a_tolerance_that_scores_one_answer_right_everywhere_is_refused(tolerance, relative):
    rows = [{"answer": i} for i in range(1, 41)]
    scorer = NumericScorer(kind="numeric", field="answer", tolerance=tolerance, relative=relative)
    found = scorer.rows_problem(rows)
    constant = any(all(scorer.score(str(answer), row) for row in rows) for answer in (0, 20.5))
    assert (found is not None) == constant, (tolerance, relative, found)
    if found is not None:
        assert found[1] == "answer" and "would score every row right" in found[2]


@FAST
@given(depth=st.integers(1, 200_000), nan=st.booleans(), twice=st.booleans())
def test_hostile_jsonl_rows_are_one_line_or_read(tmp_path_factory, depth, nan, twice):
    from evalsets.userset import read_rows

    path = tmp_path_factory.mktemp("rows") / "data.jsonl"
    value = "[" * depth + ("NaN" if nan else "1") + "]" * depth
    extra = ', "answer": 2' if twice else ""
    path.write_text(f'{{"id": 1, "prompt": "p", "answer": {value}{extra}}}\n')
    found = one_line_or_valid(read_rows, path)
    if nan or twice:
        assert isinstance(found, QuantgateError), "a row with NaN or a key twice was read"
    if isinstance(found, QuantgateError):
        assert f"{path}:1:" in str(found)
    else:
        assert json.loads(json.dumps(found[0]["answer"])) == found[0]["answer"]


@pytest.mark.parametrize("bomb", ["a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{n}: &{n} [{', '.join(['*' + p] * 10)}]\n" for p, n in zip("abcdefg", "bcdefgh", strict=True))])
def test_a_policy_that_is_a_billion_laughs_is_one_line(tmp_path, bomb):
    path = tmp_path / "policy.yaml"
    path.write_text(bomb)
    found = one_line_or_valid(load_policy, str(path))
    assert isinstance(found, QuantgateError) and "billion laughs" in str(found)


@FAST
@given(part=st.sampled_from(["a?", "(?:a?b?)", "(?:ab|cd)", "[ab]*c", r"\s*"]),
       count=st.integers(1, 5_000))
def test_a_long_pattern_is_judged_within_the_bound(part, count):
    # Judging reads each piece once: a pattern of thousands of optional pieces ends.
    problem = one_line_or_valid(regex_problem, part * count)
    assert problem is None or (isinstance(problem, str) and "\n" not in problem)
