"""How each rule decides, in the words of the policy the verdict was judged by (for the report).

The sign-off states its methods with the numbers that applied, not the defaults: a reader of a
report judged by a custom policy reads that policy's margins, levels and looks.
"""

from __future__ import annotations

from gates.policy import GatePolicy


def _pct(x: float) -> str:
    return f"{100 * x:g} %"


def methods(policy: GatePolicy) -> list[dict[str, str]]:
    """One row per rule family: what it tests, and how."""
    q, length, lat = policy.quality, policy.length, policy.latency
    margins = ", ".join(f"{name} {100 * t.accuracy_margin:g} pts" for name, t in
                        policy.tolerances.items())
    limits = ", ".join(f"{name} KL <= {t.max_kl:g}, top-1 >= {_pct(t.min_top1)}"
                       for name, t in policy.tolerances.items())
    return [
        {"rule": "quality.accuracy (pooled)", "method": (
            f"paired non-inferiority against the baseline: Tango's score interval of the paired "
            f"difference, stratified over the sets with equal weights (a set's groups are strata "
            f"inside it), margin {margins}; one-sided alpha {q.alpha:g} split over {q.max_looks} "
            f"looks (Bonferroni), a rule decided at a look stays decided")},
        {"rule": "quality.<set>", "method": (
            f"every set on its own (intersection-union: all must pass): non-inferior at the "
            f"pooled margin, or at up to {q.set_margin_factor:g}x it (the loss the items it can "
            f"reach by the last look resolve, {q.size_margin_z:g} x "
            f"sqrt({q.planning_discordance:g} / items), one margin at every look: a large set is "
            f"held to the pooled margin) while paired score tests on the "
            f"ratio of error rates (Nam-Blackwelder, Tang-Tang-Chan) show the stage makes under "
            f"{q.max_error_ratio:g}x the baseline's true errors (near the ceiling) and keeps over "
            f"1/{q.max_error_ratio:g} of its right answers (near the floor); the limit is never "
            "read off the few errors a sample of the baseline happened to make. A set at the "
            "floor (losing every right answer could not show the margin) is judged on that "
            "ratio of right answers alone: it fails once confidently beyond, blocks while "
            "unresolved where an equivalent stage would resolve by its reach, else is shown "
            "(and grows while it leans beyond or its reach could show a loss)")},
        {"rule": "quality.<set>.<group>", "method": (
            f"each group (long-context length bucket, a user set's group field) at "
            f"up to {q.group_margin_factor:g}x the margin (the loss its items resolve, as for a "
            f"set); where the baseline may sit near the ceiling or the floor (that margin wider "
            f"than {q.max_error_ratio:g}x its errors allow at the Wilson bound of its accuracy), "
            f"only while the ratio tests show it within, else a set's {q.set_margin_factor:g}x "
            f"(unless its items cannot resolve that with no flip); blocking for a stage serving a "
            f"quantized KV "
            "cache" + (" and for every stage" if q.long_context_required else "")
            + ", otherwise shown")},
        {"rule": "clusters", "method": (
            "items declaring a cluster (a template, a source document) widen every interval by "
            "their design effect: the cluster-robust (sandwich) over the independent variance of "
            "the paired differences, never below 1 (Rao-Scott)")},
        {"rule": "more items", "method": (
            f"an unresolved rule scores more items: x{q.growth:g} per look, or straight to the size "
            "its observed discordance and design effect say would resolve it (blinded "
            "re-estimation: the difference itself is not used), within the set's pool; a set "
            "whose only open rules are groups grows those groups alone, and at the last look to "
            "every item they have; a stage judged on length against a parent other than the "
            "baseline serves that parent again")},
        {"rule": "length", "method": (
            f"paired log length ratio per set and pooled (equal weights), against the parent "
            f"(x{1 - length.max_change:g}..x{1 + length.max_change:g}) and the baseline "
            f"(x{1 - length.max_change_vs_baseline:g}..x{1 + length.max_change_vs_baseline:g}): two "
            f"one-sided t-tests at alpha {q.alpha:g}"
            + (f" split over {q.max_looks} looks" if q.max_looks > 1 else "")
            + "; answers cut at the budget, on either side, are right-censored (each side's "
            "censored-normal mean, the pairs' sandwich error), or, where that cannot carry a set, "
            "the restricted mean with the newly cut share bounded; fails on a Holm-adjusted "
            f"one-sided p at alpha {q.alpha:g}; the pooled ratio decides the pass, a set's own "
            "unresolved one is shown while its estimate lies within the limit, and beyond it "
            "grows its set and blocks")},
        {"rule": "divergence.kl / top1, perplexity", "method": (
            f"top-20 coarsened per-token KL and top-1 agreement on the scoring corpus, {limits}; "
            f"two-stage studentized block bootstrap over blocks of {policy.divergence.block_tokens} "
            f"tokens ({q.bootstrap_resamples} resamples, {_pct(q.confidence)}); fewer than "
            f"{policy.divergence.min_blocks} blocks cannot decide; perplexity ratio vs parent "
            f"<= x{1 + policy.perplexity.max_increase_vs_parent:g}, vs baseline "
            f"<= x{1 + policy.perplexity.max_increase_vs_baseline:g}")},
        {"rule": "latency", "method": (
            f"interleaved rounds of stage and reference on the same cores; per round the log "
            f"ratio of medians, a one-sided Student-t bound; TPOT p50 <= +{_pct(lat.max_tpot_p50_increase)}, "
            f"TTFT p50 <= +{_pct(lat.max_ttft_p50_increase)} per step, summed along the chain "
            f"against the baseline; "
            + (f"required: unresolved steps get more rounds up to {lat.max_rounds}"
               if lat.required else "advisory when unresolved")
            + f"; contended (others' CPU > {_pct(lat.max_other_cpu_share)}) is inconclusive")},
        {"rule": "load errors", "method": (
            f"exact one-sided binomial test of an error rate <= {_pct(policy.load.max_error_rate)} "
            f"per load level, at alpha {q.alpha:g}")},
    ]
