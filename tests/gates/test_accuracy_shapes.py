"""Accuracy rules on real shapes: ceilings, groups as strata, KV stages per group, clusters, looks."""

from __future__ import annotations

from evalsets.results import QualityItem, QualityResult, TaskQuality
from gates.accuracy import SetCounts, more_items, next_look, own_margin, quality_checks
from gates.noninferiority import Stratum, design_effect, score_interval
from gates.policy import GatePolicy
from gates.record import StageRecord

POLICY = GatePolicy()
W8A8 = {"weights": "int8/channel", "activations": "int8/token/dynamic", "kv_cache": "auto"}
KV = W8A8 | {"kv_cache": "fp8_e4m3"}
BUCKETS = ("512", "1k", "2k", "4k")


def items(scores: list[float], groups: list[str] | None = None,
          clusters: list[str] | None = None) -> list[QualityItem]:
    return [QualityItem(id=str(i), prompt_hash="h", response="", score=score,
                        group=groups[i] if groups else None,
                        cluster=clusters[i] if clusters else None)
            for i, score in enumerate(scores)]


def record(name: str, parent: str | None, sets: dict[str, list[QualityItem]],
           axes: dict[str, str] = W8A8, look_sizes: list[dict[str, int]] | None = None,
           ) -> StageRecord:
    tasks = {set_name: TaskQuality(task=set_name, metric="acc", items=rows,
                                   value=sum(r.score for r in rows) / len(rows))
             for set_name, rows in sets.items()}
    return StageRecord(name=name, kind="baseline" if parent is None else "stage", parent=parent,
                       axes=axes, quality=QualityResult(tasks=tasks,
                                                        look_sizes=look_sizes or []))


def by_rule(checks) -> dict:
    return {c.rule: c for c in checks}


def bucketed(per_bucket: int, right: dict[str, int]) -> tuple[list[float], list[str]]:
    """Items interleaved across the four buckets, the first `right[b]` of each bucket right."""
    scores, groups, seen = [], [], dict.fromkeys(BUCKETS, 0)
    for i in range(per_bucket * len(BUCKETS)):
        bucket = BUCKETS[i % len(BUCKETS)]
        scores.append(1.0 if seen[bucket] < right[bucket] else 0.0)
        groups.append(bucket)
        seen[bucket] += 1
    return scores, groups


def test_a_set_at_the_ceiling_vouches_and_its_drop_counts():
    """95 % right leaves room to lose points: the set is pooled and judged, not left out."""
    base = [1.0] * 190 + [0.0] * 10
    baseline = record("baseline", None, {"code": items(base)})
    same = record("s", "baseline", {"code": items(base)})
    pooled = by_rule(quality_checks(same, baseline, baseline, POLICY))["quality.accuracy"]
    assert pooled.status == "pass" and pooled.details["sets"] == 1
    broken = [0.0] * 60 + [1.0] * 130 + [0.0] * 10  # 95 % -> 65 %
    checks = by_rule(quality_checks(record("s", "baseline", {"code": items(broken)}), baseline,
                                    baseline, POLICY))
    assert checks["quality.accuracy"].status == "fail"
    assert checks["quality.code"].status == "fail"


def test_a_ceiling_set_that_more_than_doubles_its_errors_rolls_back_though_within_points():
    """95 % -> 87 % is 8 points, inside the 16-point set margin, but 2.6x the errors: the set's
    margin there is capped (2.5x the baseline's errors, never below the pooled 8 points)."""
    base = [1.0] * 152 + [0.0] * 8
    baseline = record("baseline", None, {"code": items(base)})
    worse = [0.0] * 13 + [1.0] * 139 + [0.0] * 8  # 13 of 152 broke: 95 % -> 86.9 %
    checks = by_rule(quality_checks(record("s", "baseline", {"code": items(worse)}), baseline,
                                    baseline, POLICY))
    code = checks["quality.code"]
    assert code.status != "pass" and not code.passed
    assert code.limit == -0.08  # 1.5 x the baseline's 8.5 / 161 errors is 7.9: the pooled 8
    held = [0.0] * 2 + [1.0] * 150 + [0.0] * 6 + [1.0] * 2  # 2 broke, 2 fixed
    assert by_rule(quality_checks(record("s", "baseline", {"code": items(held)}), baseline,
                                  baseline, POLICY))["quality.code"].status == "pass"
    perfect = record("baseline", None, {"code": items([1.0] * 80)})  # nothing left to cap
    assert by_rule(quality_checks(perfect, perfect, perfect, POLICY))["quality.code"].status == "pass"


def test_a_ceiling_margin_is_not_read_off_a_few_baseline_errors():
    """A baseline that reads 92.5 % on 80 items (6 errors) may truly sit at 95 %, where the
    policy allows 8 points, not the 11 its sample implies. 3 answers broke (-3.75 points, a
    lower bound just past -8): the old margin, read off the sample, passed it; the ratio test
    cannot show the stage within 2.5x the baseline's true errors, so it is unresolved. Four
    times the items, in the same proportions, show it: then the wide margin holds."""
    def judged(copies: int):
        base = ([1.0] * 74 + [0.0] * 6) * copies
        stage = ([0.0] * 3 + [1.0] * 71 + [0.0] * 6) * copies
        baseline = record("baseline", None, {"code": items(base)})
        return by_rule(quality_checks(record("s", "baseline", {"code": items(stage)}), baseline,
                                      baseline, POLICY))["quality.code"]

    few = judged(1)
    assert few.status == "inconclusive" and few.details["ci_low"] < -0.08, few.reason
    assert few.details["ci_low"] > -0.12  # what the sample's accuracy implied (1.5 x 7.4 %)
    assert "unresolved" in few.reason
    many = judged(4)
    assert many.status == "pass" and "within" in many.reason, many.reason


def test_a_set_near_the_floor_is_judged_on_its_right_answers_not_left_out():
    """20 % right: losing half the right answers is 10 points, which the 16-point set margin
    passes; near the floor the stage must keep over 1/2.5 of them, which 20 of 40 does not
    show: held to the pooled 8 points, unresolved here."""
    base = [1.0] * 40 + [0.0] * 160
    baseline = record("baseline", None, {"math": items(base)})
    lost = [0.0] * 20 + [1.0] * 20 + [0.0] * 160
    math_check = by_rule(quality_checks(record("s", "baseline", {"math": items(lost)}),
                                        baseline, baseline, POLICY))["quality.math"]
    assert math_check.status != "pass" and not math_check.passed, math_check.reason
    assert math_check.limit == -0.08 and "unresolved" in math_check.reason
    # A set the baseline gets nothing right cannot lose anything: shown, never blocking; and
    # one it gets 3/120 right is judged at no less than the pooled margin (it may pass unchanged).
    few = record("baseline", None, {"orders": items([1.0] * 3 + [0.0] * 117)})
    assert by_rule(quality_checks(few, few, few, POLICY))["quality.orders"].passed
    nothing_right = record("baseline", None, {"math": items([0.0] * 200)})
    shown = by_rule(quality_checks(nothing_right, nothing_right, nothing_right, POLICY))
    assert shown["quality.math"].status == "inconclusive" and shown["quality.math"].passed


def test_a_set_at_the_floor_is_judged_on_the_ratio_of_its_right_answers():
    """8 % right (24 of 300): losing every right answer is 8 points, a drop the 8-point margin
    can never show, so the set was left out and the stage went. On the ratio (keep over 1/2.5
    of the right answers) the loss fails, while an equivalent stage whose right answers are
    others' (a guess's, reshuffled) passes; 3 right answers flipping at random are too few to
    resolve and are shown, not blocking."""
    vouching = items([1.0] * 120 + [0.0] * 80)
    base = [1.0] * 24 + [0.0] * 276
    baseline = record("baseline", None, {"business": items(base), "math": vouching})

    def judged(business: list[float]):
        stage = record("s", "baseline", {"business": items(business), "math": vouching})
        return by_rule(quality_checks(stage, baseline, baseline, POLICY))

    lost = judged([0.0] * 300)
    assert lost["quality.business"].status == "fail" and not lost["quality.business"].passed
    assert "at the floor" in lost["quality.business"].reason
    assert lost["quality.accuracy"].status == "pass"  # the pooled rule alone would have gone
    same = judged([0.0] * 24 + [1.0] * 24 + [0.0] * 252)["quality.business"]
    assert same.status == "pass" and same.passed, same.reason
    guess = record("baseline", None, {"business": items([1.0] * 3 + [0.0] * 297),
                                      "math": vouching})
    reshuffled = record("s", "baseline", {"business": items([0.0] * 3 + [1.0] * 3 + [0.0] * 294),
                                          "math": vouching})
    shown = by_rule(quality_checks(reshuffled, guess, guess, POLICY))["quality.business"]
    assert shown.status == "inconclusive" and shown.passed and "too few" in shown.reason


def test_a_spec_whose_every_set_is_at_the_floor_is_judged_on_their_ratios():
    """One 1,000-item set at 5 %: nothing vouches at an 8-point margin, yet its 50 right answers
    resolve their ratio: an equivalent stage goes, one that keeps a fifth of them does not."""
    base = [1.0] * 50 + [0.0] * 950
    baseline = record("baseline", None, {"orders": items(base)})
    same = record("s", "baseline", {"orders": items([0.0] * 10 + [1.0] * 50 + [0.0] * 940)})
    checks = by_rule(quality_checks(same, baseline, baseline, POLICY))
    assert checks["quality.accuracy"].status == "pass"
    assert "every set is at the floor" in checks["quality.accuracy"].reason
    assert checks["quality.orders"].status == "pass"
    fifth = record("s", "baseline", {"orders": items([1.0] * 10 + [0.0] * 990)})
    assert by_rule(quality_checks(fifth, baseline, baseline, POLICY))["quality.orders"].status == "fail"


def test_a_floor_set_that_leans_beyond_its_ratio_grows_to_show_it():
    """40 items, 3 right, all three lost: too few to resolve, but more items can show the loss;
    3 right answers kept ask for nothing (they cannot resolve, nor lean beyond)."""
    vouching = items([1.0] * 120 + [0.0] * 80)
    baseline = record("baseline", None, {"business": items([1.0] * 3 + [0.0] * 37),
                                         "math": vouching})
    lost = record("s", "baseline", {"business": items([0.0] * 40), "math": vouching})
    pools = {"business": 300, "math": 200}
    accuracy_only = GatePolicy(length={"required": False})  # these items carry no lengths
    assert more_items(lost.quality, baseline.quality, "8bit", accuracy_only, pools) == {
        "business": 300, "math": 200}
    assert more_items(baseline.quality, baseline.quality, "8bit", accuracy_only, pools) is None


def test_an_unresolved_set_grows_at_once_to_where_it_resolves():
    """20 code items with 3 flips each way: doubling to 40 would not resolve 16 points at 15 %
    discordance; the next look asks for the re-estimated size, within the pool."""
    base = [1.0] * 10 + [0.0] * 10
    stage = [0.0] * 3 + [1.0] * 7 + [1.0] * 3 + [0.0] * 7
    baseline = record("baseline", None, {"code": items(base)})
    s = record("s", "baseline", {"code": items(stage)})
    grown = more_items(s.quality, baseline.quality, "8bit", POLICY, {"code": 1000})
    assert grown["code"] > 40
    assert more_items(s.quality, baseline.quality, "8bit", POLICY, {"code": 60}) == {"code": 60}


def test_groups_are_strata_of_their_set():
    """Same paired difference; the bound moves only by what the strata's own variances say."""
    plain = score_interval([Stratum(120, 10, 10)], 0.05)
    strata = score_interval([Stratum(30, 1, 1, 0.25), Stratum(30, 2, 2, 0.25),
                             Stratum(30, 3, 3, 0.25), Stratum(30, 4, 4, 0.25)], 0.05)
    assert strata[0] == plain[0] == 0
    assert abs(strata[1] - plain[1]) < 0.005


def test_a_kv_stage_is_judged_per_bucket_and_a_collapsed_bucket_fails():
    right = {"512": 29, "1k": 27, "2k": 24, "4k": 20}
    base, groups = bucketed(30, right)
    collapsed, _ = bucketed(30, right | {"4k": 2})  # 4k: 67 % -> 7 %
    baseline = record("baseline", None, {"long_context": items(base, groups)})
    kv = record("kv", "baseline", {"long_context": items(collapsed, groups)}, axes=KV)
    checks = by_rule(quality_checks(kv, baseline, baseline, POLICY))
    four_k = checks["quality.long_context.4k"]
    assert four_k.status == "fail" and not four_k.passed
    q = POLICY.quality
    assert four_k.limit == -POLICY.tolerance("8bit").accuracy_margin * q.group_margin_factor
    assert checks["quality.long_context.512"].status == "pass"


def test_an_unresolved_bucket_blocks_a_kv_stage_only():
    right = {"512": 28, "1k": 24, "2k": 20, "4k": 16}
    base, groups = bucketed(30, right)
    worse, _ = bucketed(30, right | {"4k": 10})  # -20 pts: beyond no bound at 30 items
    baseline = record("baseline", None, {"long_context": items(base, groups)})
    for axes, blocks in ((KV, True), (W8A8, False)):
        stage = record("s", "baseline", {"long_context": items(worse, groups)}, axes=axes)
        four_k = by_rule(quality_checks(stage, baseline, baseline, POLICY))[
            "quality.long_context.4k"]
        assert four_k.status == "inconclusive" and four_k.passed is not blocks, axes


def test_an_unresolved_bucket_grows_its_set_on_a_kv_stage():
    right = {"512": 5, "1k": 4, "2k": 3, "4k": 3}
    base, groups = bucketed(6, right)  # 6 per bucket: below min_items
    baseline = record("baseline", None, {"long_context": items(base, groups)})
    stage = record("s", "baseline", {"long_context": items(base, groups)}, axes=KV)
    pools = {"long_context": 120}
    # The set jumps to the size at which every bucket has min_items (4 x 20), not just 2x.
    assert more_items(stage.quality, baseline.quality, "8bit", POLICY, pools, axes=KV) == {
        "long_context": 80}
    assert more_items(stage.quality, baseline.quality, "8bit", POLICY, {"long_context": 60},
                      axes=KV) == {"long_context": 60}  # within the pool
    # The look names the rules it grows for: each bucket on the KV stage, none on a weights one.
    look = next_look(stage.quality, baseline.quality, "8bit", POLICY, pools, axes=KV)
    assert look.reasons == {"long_context": ["quality.accuracy"] + [
        f"quality.long_context.{bucket}" for bucket in BUCKETS]}
    assert "long_context 80 items (quality.accuracy, quality.long_context.512" in look.line()
    weights = record("s", "baseline", {"long_context": items(base, groups)})
    assert next_look(weights.quality, baseline.quality, "8bit", POLICY, pools).reasons == {
        "long_context": ["quality.accuracy"]}


def test_declared_clusters_widen_the_interval():
    assert design_effect([1, 0, -1, 0], ["a", "b", "c", "d"]) == 1.0
    same_cluster = [-1] * 5 + [0] * 5 + [1] * 5 + [0] * 85
    clusters = [f"c{i // 5}" for i in range(100)]
    assert design_effect(same_cluster, clusters) > 3
    base = [1.0] * 50 + [0.0] * 50
    stage = list(base)
    for i in range(10):  # two clusters of five break together
        stage[i] = 0.0
    for i in range(50, 60):  # two clusters of five are fixed together
        stage[i] = 1.0
    plain = by_rule(quality_checks(record("s", "baseline", {"math": items(stage)}),
                                   record("baseline", None, {"math": items(base)}),
                                   record("baseline", None, {"math": items(base)}), POLICY))
    baseline = record("baseline", None, {"math": items(base, clusters=clusters)})
    clustered = by_rule(quality_checks(
        record("s", "baseline", {"math": items(stage, clusters=clusters)}), baseline, baseline,
        POLICY))
    assert clustered["quality.math"].details["ci_low"] < plain["quality.math"].details["ci_low"]
    assert "design effect" in clustered["quality.math"].reason


def test_a_rule_decided_at_an_earlier_look_stays_decided():
    """Pooled passes on the first 200 items; 100 later items scored for another set leave it
    unresolved on all 300: the first look's decision stands (group-sequential)."""
    first = [1.0] * 100 + [0.0] * 100
    later_base = [1.0] * 50 + [0.0] * 50
    later_stage = [0.0] * 30 + [1.0] * 20 + [0.0] * 50  # -30 pts in the later items
    baseline = record("baseline", None, {"math": items(first + later_base)})
    stage = record("s", "baseline", {"math": items(first + later_stage)},
                   look_sizes=[{"math": 200}])
    pooled = by_rule(quality_checks(stage, baseline, baseline, POLICY))["quality.accuracy"]
    assert pooled.status == "pass" and "decided at look 1 (200 items)" in pooled.reason
    undecided = record("s", "baseline", {"math": items(first + later_stage)})
    again = by_rule(quality_checks(undecided, baseline, baseline, POLICY))["quality.accuracy"]
    assert again.status != "pass"


def test_an_earlier_look_without_every_set_decides_nothing_pooled():
    """At look 1 a 10-item set could not take part: the pooled pass of that look does not stand."""
    good = [1.0] * 100 + [0.0] * 100
    small_base = [1.0] * 20 + [0.0] * 20
    small_stage = [0.0] * 16 + [1.0] * 4 + [0.0] * 20  # collapsed: -40 pts
    baseline = record("baseline", None, {"math": items(good), "code": items(small_base)})
    stage = record("s", "baseline", {"math": items(good), "code": items(small_stage)},
                   look_sizes=[{"math": 200, "code": 10}])
    checks = by_rule(quality_checks(stage, baseline, baseline, POLICY))
    assert "decided at look 1" not in checks["quality.accuracy"].reason
    assert checks["quality.code"].status == "fail"


def test_an_unresolved_bucket_grows_alone_and_to_all_its_items_at_the_last_look():
    right = {"512": 28, "1k": 24, "2k": 20, "4k": 16}
    base, groups = bucketed(30, right)
    worse, _ = bucketed(30, right | {"4k": 10})  # the 4k bucket alone unresolved
    def timed(rows: list[QualityItem]) -> list[QualityItem]:  # every answer 5 tokens
        return [row.model_copy(update={"output_tokens": 5, "finish_reason": "stop"})
                for row in rows]

    math_items = timed(items([1.0, 0.0] * 100))
    baseline = record("baseline", None, {"long_context": timed(items(base, groups)),
                                         "math": math_items})
    stage = record("s", "baseline", {"long_context": timed(items(worse, groups)),
                                     "math": math_items}, axes=KV)
    pools = {"long_context": 480, "math": 1000}
    group_pools = {"long_context": dict.fromkeys(BUCKETS, 120)}
    look = next_look(stage.quality, baseline.quality, "8bit", POLICY, pools, axes=KV,
                     group_pools=group_pools)
    assert list(look.groups) == ["long_context"] and list(look.groups["long_context"]) == ["4k"]
    four_k = look.groups["long_context"]["4k"]
    assert 60 <= four_k < 120  # x2 or the re-estimated size: not every bucket, nor all it has
    assert look.reasons == {"long_context": ["quality.long_context.4k"]}
    assert f"long_context 4k {four_k} items (quality.long_context.4k)" in look.line()
    # A reader growing whole sets asks the prefix that holds as many 4k items.
    assert look.sizes == {"long_context": 4 * four_k, "math": 200}
    assert more_items(stage.quality, baseline.quality, "8bit", POLICY, pools, axes=KV,
                      group_pools=group_pools) == look.sizes
    # No later look can resolve it: the last one takes every 4k item there is.
    stage.quality.looks = POLICY.quality.max_looks - 1
    last = next_look(stage.quality, baseline.quality, "8bit", POLICY, pools, axes=KV,
                     group_pools=group_pools)
    assert last.groups == {"long_context": {"4k": 120}}
    # A weights stage judges buckets only on confident harm: nothing grows for them.
    weights = record("s", "baseline", {"long_context": timed(items(worse, groups)),
                                       "math": math_items})
    assert next_look(weights.quality, baseline.quality, "8bit", POLICY, pools) is None


def resolves(n: int) -> float:
    """The loss n items resolve, as the policy states it."""
    q = POLICY.quality
    return q.size_margin_z * (q.planning_discordance / n) ** 0.5


def test_a_large_bucket_is_held_to_the_loss_its_items_resolve():
    """A 250-item bucket losing 12 points cleared the 20-point group margin (2.5x); its own
    items resolve 14 points (7 x sqrt(0.10 / 250)), so on a KV stage it now blocks. A bucket of
    30 keeps the factor's 20, and an equivalent large bucket still passes."""
    right = {"512": 237, "1k": 212, "2k": 187, "4k": 137}
    base, groups = bucketed(250, right)
    worse, _ = bucketed(250, right | {"4k": 107})
    baseline = record("baseline", None, {"long_context": items(base, groups)})
    kv = record("kv", "baseline", {"long_context": items(worse, groups)}, axes=KV)
    checks = by_rule(quality_checks(kv, baseline, baseline, POLICY))
    four_k = checks["quality.long_context.4k"]
    assert abs(four_k.limit + resolves(250)) < 1e-9
    assert four_k.status != "pass" and not four_k.passed
    assert four_k.details["ci_low"] > -0.20  # what the factor alone would have passed
    assert checks["quality.long_context.512"].status == "pass"


def test_a_look_is_judged_at_the_margin_of_the_items_the_set_can_reach():
    """The first look's 30 items a bucket would be judged at 20 points; recorded to reach 250
    a bucket, every look holds it to 14: a wide early margin would pass a bucket for good
    that its last look would not."""
    right = {"512": 28, "1k": 25, "2k": 22, "4k": 17}
    base, groups = bucketed(30, right)
    baseline = record("baseline", None, {"long_context": items(base, groups)})
    kv = record("kv", "baseline", {"long_context": items(base, groups)}, axes=KV)
    limit = by_rule(quality_checks(kv, baseline, baseline, POLICY))["quality.long_context.4k"].limit
    assert limit == -0.08 * POLICY.quality.group_margin_factor
    kv.quality.reach = {"long_context": 1000} | {f"long_context.{b}": 250 for b in BUCKETS}
    checks = by_rule(quality_checks(kv, baseline, baseline, POLICY))
    assert abs(checks["quality.long_context.4k"].limit + resolves(250)) < 1e-9
    counts = SetCounts.of("quality.long_context", list(zip(baseline.quality.tasks[
        "long_context"].items, kv.quality.tasks["long_context"].items, strict=True)), [])
    assert own_margin(counts, 0.08, 2.0, POLICY) == 0.16  # 120 items: the set factor
    assert own_margin(counts, 0.08, 2.0, POLICY, reach=1000) == 0.08  # 1,000: the pooled one


def test_a_set_a_jump_took_past_its_reach_is_held_to_what_its_items_resolve():
    """Math recorded to reach 160 (40 at the first look), then a re-estimated jump took it to
    320 of its pool: 320 items resolve 12.4 points, so a 10-point loss whose bound reaches past
    them is no longer cleared by the 16 points its reach alone would have allowed."""
    base = [1.0] * 160 + [0.0] * 160
    worse = [0.0] * 34 + [1.0] * 126 + [1.0] * 2 + [0.0] * 158  # -10 points: 34 broke, 2 fixed
    baseline = record("baseline", None, {"math": items(base)})
    stage = record("s", "baseline", {"math": items(worse)})
    stage.quality.reach = {"math": 160}
    check = by_rule(quality_checks(stage, baseline, baseline, POLICY))["quality.math"]
    assert abs(check.limit + resolves(320)) < 1e-9
    assert check.status != "pass" and not check.passed, check.reason
    assert check.details["ci_low"] > -0.16  # what the margin of its reach would have passed


def _with_flips(base: list[float], groups: list[str], bucket: str, broke: int,
                fixed: int) -> list[float]:
    """`base` with the first `broke` right and `fixed` wrong answers of one bucket flipped."""
    stage, left = list(base), {1.0: broke, 0.0: fixed}
    for i, (score, group) in enumerate(zip(base, groups, strict=True)):
        if group == bucket and left[score]:
            stage[i], left[score] = 1.0 - score, left[score] - 1
    return stage


def test_a_bucket_at_the_ceiling_is_judged_on_its_errors():
    """A 120-item bucket at 95 % losing 12 points (3.3x its errors) cleared the 20-point group
    margin; where the baseline may sit near the ceiling a bucket gets the wide margin only within
    2.5x its errors, else a set's 16 points. The same loss at 70 % is within the ratio and passes
    at 20, and an equivalent bucket at 95 % passes."""
    right = {"512": 114, "1k": 102, "2k": 84, "4k": 66}
    base, groups = bucketed(120, right)
    baseline = record("baseline", None, {"long_context": items(base, groups)})

    def bucket(stage_scores: list[float], name: str):
        kv = record("kv", "baseline", {"long_context": items(stage_scores, groups)}, axes=KV)
        return by_rule(quality_checks(kv, baseline, baseline, POLICY))[
            f"quality.long_context.{name}"]

    ceiling = bucket(_with_flips(base, groups, "512", broke=14, fixed=0), "512")
    assert ceiling.status != "pass" and not ceiling.passed
    assert ceiling.details["ci_low"] > -0.20  # what the 20-point margin alone passed
    assert "2.5x the baseline's errors" in ceiling.reason
    middle = bucket(_with_flips(base, groups, "2k", broke=14, fixed=0), "2k")
    assert middle.status == "pass", middle.reason
    equivalent = bucket(_with_flips(base, groups, "512", broke=6, fixed=5), "512")
    assert equivalent.status == "pass", equivalent.reason
