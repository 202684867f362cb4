"""Output-length rules: per set, the paired log length ratio with cut answers as censored values.

Each pair of answers to one item gives r = log(stage tokens / reference tokens) (an empty answer
counted as one token), the reference being the parent and, for the chain as a whole, the
baseline. Per set:

- An answer cut at the generation budget (finish "length"), on either side, is right-censored:
  its true length is at least the cut one. No pair is set aside. Each side's log lengths get a
  censored-normal (Tobit) maximum likelihood fit of their mean, and the ratio is the difference
  of the two means. A changed greedy answer is often another answer, whose length follows the
  set's lengths rather than the reference's: setting aside the pairs whose reference was cut
  kept only short references and read an unchanged stage as longer (x1.082 on the real W8A16
  math answers with 39 % cut at 64 tokens, x1.091 on HumanEval), and a fit of the pairs' own
  ratios cannot place those. The two fits leave an equivalent stage at x1 whatever the pairs'
  dependence, and read a drift of the whole law as itself.
- The pairing enters through the error: each pair's difference of the two fits' influence on
  their means (the M-estimation sandwich), its variance times n / (n - 1). Unchanged pairs
  (about half of a quantized stage's greedy answers) add nothing to it. Without cuts this is
  exactly the paired t-test of the mean log ratio.
- A ratio passes when its 1 - 2 alpha interval (Student t, n - 1 degrees of freedom) lies within
  log(1 - limit)..log(1 + limit): two one-sided tests (Schuirmann) at quality.alpha split over
  the planned looks (the adaptive looks grow the sets while the rule is unresolved, each look a
  chance to pass), so a ratio drifting by exactly the limit passes at most alpha of the time.
  The pooled ratio (the sets' ratios with equal weights, as accuracy pools them, so one large
  unchanged set cannot dilute drift in the others) decides the pass: one set's items cannot
  resolve +-10 % when a changed greedy answer is often a different answer (sigma 0.55 per pair
  on the demo model). Any set, or the pool, fails when its one-sided p of lying beyond the
  limit, Holm-adjusted over the sets and the pool, is below quality.alpha (the full level: a
  drifting stage stops the looks at once), so drift in some sets cannot hide behind unchanged
  ones. A set's own unresolved ratio is shown, not blocking, while its estimate lies within the
  limit; one whose estimate lies beyond it blocks (the looks grow its set first): its items lean
  towards drift the pool cannot see (x1.20 in code alone is x1.05 pooled), and what they could
  not clear is not established.
- Fail closed: a set with fewer than quality.min_items pairs is inconclusive and blocks whatever
  the policy says. A side whose uncut answers are too few or all alike to show a spread borrows
  the other side's (FALLBACK_SIGMA if that one's fit fails); where neither shows one, nothing can
  be fitted. One where either side has confidently more than length.max_censored_share of its
  answers cut (the lower end of the share's Wilson interval above it: the cap is on the true
  share), or whose fits do not converge, cannot carry a fit (its mean would rest on the normal
  tail): its ratio is then the restricted mean (each cut answer at its cut length, as survival
  analysis restricts a mean to its horizon), which says how lengths moved within the budget and
  nothing beyond it. It may pass only while what ran past the budget is a few answers, not the
  drift (a control whose 2 changed answers of 162 both ran to the budget), in two ways, each
  within length.max_length_finish_increase at its 1 - 2 alpha upper end: the answers newly cut
  in the sets read within the budget, over all pairs against this reference (Wilson), and the
  rise in the share cut over all sets (the paired Newcombe interval: answers cut anew less those
  no longer cut). The first counts only the sets read so: a set that carries its fit has its cut
  answers modelled, and counting them blocked a control whose 3 changed math answers of 180 ran
  to the budget (and 3 others stopped short of it) while its mostly cut set had not changed at
  all. The second keeps those sets' cuts in as a net rise: a stage that pushes answers past the
  budget anywhere is not read within it. Otherwise it cannot pass, and fails only where the
  restricted mean is a bound (no reference answer alone was cut) that already lies confidently
  above the limit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
from scipy import optimize, special, stats

from evalsets.results import TaskQuality
from gates.noninferiority import look_alpha
from gates.policy import GatePolicy
from gates.record import StageRecord, paired_items
from gates.stats import Interval, holm, mean_ci, paired_rise, wilson
from gates.verdict import Check, Status, judged, missing, points

POOLED = "all sets"


def _log_tokens(tokens: int) -> float:
    """log of an answer's length in tokens, an empty answer counted as one (kept, not skipped)."""
    return math.log(max(tokens, 1))


@dataclass(frozen=True)
class Pairs:
    """One set's paired answers: log(max(tokens, 1)) of each side and which were cut at the budget
    (a cut answer's true length is at least the one seen). Not log(tokens + 1): the added token
    shrank short answers' ratios towards 1 (x1.20 on 12-token long-context answers read x1.185,
    and went 6.0 % in the decision benchmark, where the limit is x1.10)."""

    stage: np.ndarray
    reference: np.ndarray
    stage_cut: np.ndarray
    reference_cut: np.ndarray

    @classmethod
    def of(cls, reference: TaskQuality, stage: TaskQuality | None) -> Pairs:
        known = [(r, s) for r, s in paired_items(reference, stage)
                 if s.output_tokens is not None and r.output_tokens is not None]
        return cls(np.array([_log_tokens(s.output_tokens) for _, s in known], dtype=float),
                   np.array([_log_tokens(r.output_tokens) for r, _ in known], dtype=float),
                   np.array([s.finish_reason == "length" for _, s in known], dtype=bool),
                   np.array([r.finish_reason == "length" for r, _ in known], dtype=bool))

    @property
    def ratios(self) -> np.ndarray:
        """Per pair log(stage tokens / reference tokens), each at its cut length."""
        return self.stage - self.reference

    @property
    def changed(self) -> np.ndarray:
        return (self.stage != self.reference) | (self.stage_cut != self.reference_cut)

    @property
    def newly_cut(self) -> np.ndarray:
        return self.stage_cut & ~self.reference_cut


@dataclass(frozen=True)
class Drift:
    """The mean log ratio of one set (or all), its interval and the p of lying beyond the limit."""

    estimate: float
    low: float
    high: float
    n: int
    changed: int
    cut: int
    reference_cut: int  # pairs whose reference answer was cut (kept: at least its cut length)
    p_above: float  # one-sided p of "mean <= log(1 + limit)"
    p_below: float  # one-sided p of "mean >= log(1 - limit)"
    unresolved: str | None = None  # why the set cannot pass
    too_few: bool = False
    se: float = math.inf  # standard error of the estimate
    df: float = math.inf  # its degrees of freedom
    restricted: bool = False  # the cut answers at their cut length: the ratio within the budget

    @property
    def p_beyond(self) -> float:
        return min(self.p_above, self.p_below)


def _t_interval(mean: float, se: float, n: int, alpha: float,
                bounds: tuple[float, float], df: float | None = None,
                ) -> tuple[float, float, float, float]:
    """The 1 - 2 alpha interval, p above bounds[1], p below bounds[0] (n - 1 degrees of freedom
    unless `df` is given)."""
    df = n - 1 if df is None else df
    if se == 0:
        return mean, mean, float(mean <= bounds[1]), float(mean >= bounds[0])
    half = stats.t.isf(alpha, df) * se
    return (mean - half, mean + half, float(stats.t.sf((mean - bounds[1]) / se, df)),
            float(stats.t.sf((bounds[0] - mean) / se, df)))


def _drift(mean: float, se: float, counts: dict[str, int], alpha: float,
           bounds: tuple[float, float], df: float | None = None) -> Drift:
    df = counts["n"] - 1 if df is None else df
    low, high, p_above, p_below = _t_interval(mean, se, counts["n"], alpha, bounds, df)
    return Drift(mean, low, high, **counts, p_above=p_above, p_below=p_below, se=se, df=df)


def pooled_drift(results: list[Drift], bounds: tuple[float, float], alpha: float) -> Drift:
    """Equal weights over the sets, as the accuracy rule pools them: one large set that kept its
    lengths cannot dilute three that drifted. The mean of the sets' estimates, its variance the
    sum of theirs over k^2, Welch-Satterthwaite degrees of freedom. A set too small to judge is
    left out (and named); one whose censoring leaves it unbounded leaves the pool unbounded."""
    usable = [r for r in results if not r.too_few]
    counts = {"n": sum(r.n for r in results), "changed": sum(r.changed for r in results),
              "cut": sum(r.cut for r in results),
              "reference_cut": sum(r.reference_cut for r in results)}
    if not usable:
        return Drift(0.0, -math.inf, math.inf, **counts, p_above=1.0, p_below=1.0,
                     too_few=True, unresolved="no set has enough pairs: cannot decide, fail "
                     "closed")
    k = len(usable)
    mean = sum(r.estimate for r in usable) / k
    unbounded = [r for r in usable if r.unresolved]
    restricted = any(r.restricted for r in usable)
    if unbounded:
        low = sum(r.low for r in usable) / k
        return Drift(mean, low, math.inf, **counts, p_above=min(r.p_above for r in usable),
                     p_below=1.0, unresolved=f"{len(unbounded)} set(s) bounded below only "
                     "(their cut answers): the pool is too")
    variance = sum(r.se**2 for r in usable) / k**2
    terms = sum(r.se**4 / r.df for r in usable if r.df > 0)
    df = (k**2 * variance) ** 2 / terms if terms > 0 else math.inf
    pooled = _drift(mean, math.sqrt(variance), counts, alpha, bounds, df)
    return replace(pooled, restricted=restricted, p_below=1.0 if restricted else pooled.p_below)


def _log_likelihood(params: np.ndarray, x: np.ndarray, cut: np.ndarray) -> float:
    """Censored-normal log likelihood (up to a constant) of (mu, log sigma): log densities of the
    exact values, log survival (scipy.special.log_ndtr) of the cut ones."""
    mu, log_sigma = params
    z = (x - mu) / math.exp(log_sigma)
    exact = z[~cut]
    return float(-0.5 * exact @ exact - exact.size * log_sigma + special.log_ndtr(-z[cut]).sum())


def _item_scores(params: np.ndarray, x: np.ndarray, cut: np.ndarray) -> np.ndarray:
    """Each value's gradient of `_log_likelihood` in (mu, log sigma), one row per value; the
    inverse Mills ratio phi(z) / Phi(-z) of the cut ones taken in logs (finite far in the tail)."""
    mu, log_sigma = params
    sigma = math.exp(log_sigma)
    z = (x - mu) / sigma
    mills = np.exp(stats.norm.logpdf(z) - special.log_ndtr(-z))
    d_mu = np.where(cut, mills, z) / sigma
    d_log_sigma = np.where(cut, mills * z, z * z - 1)
    return np.column_stack([d_mu, d_log_sigma])


# The spread of log lengths when a side's uncut answers are too few or all alike to estimate it
# (and the other side's cannot lend one): what SmolLM2's real answers show per changed pair.
FALLBACK_SIGMA = 0.55


def _spread_known(x: np.ndarray, cut: np.ndarray) -> bool:
    exact = x[~cut]
    return exact.size >= 2 and np.ptp(exact) > 0


def _fit(x: np.ndarray, cut: np.ndarray, sigma: float | None = None,
         ) -> tuple[float, float, np.ndarray] | None:
    """One side's censored-normal (Tobit) maximum likelihood fit: (mu, sigma, each value's
    influence on mu), the influence being the mu row of the inverse observed information times
    the value's score (M-estimation: mu-hat - mu is about their sum). With `sigma` given, only mu
    is fitted. None when the fit does not converge to a finite, curved maximum."""
    if sigma is not None:
        log_sigma = math.log(sigma)
        fit = optimize.minimize_scalar(
            lambda mu: -_log_likelihood(np.array([mu, log_sigma]), x, cut),
            bracket=(float(x.mean()) - 1, float(x.mean()) + 1))
        params = np.array([float(fit.x), log_sigma])
        scores = _item_scores(params, x, cut)[:, 0]
        step = 1e-5
        information = -(_item_scores(params + [step, 0], x, cut)[:, 0].sum()
                        - _item_scores(params - [step, 0], x, cut)[:, 0].sum()) / (2 * step)
        if not (math.isfinite(params[0]) and information > 0):
            return None
        return float(params[0]), sigma, scores / information
    start = np.array([x.mean(), math.log(x.std() + 1e-3)])
    fit = optimize.minimize(lambda p: -_log_likelihood(p, x, cut), start, method="BFGS",
                            jac=lambda p: -_item_scores(p, x, cut).sum(axis=0))
    params = fit.x
    if not np.all(np.isfinite(params)):
        return None
    step = 1e-5
    hessian = np.column_stack([(_item_scores(params + unit, x, cut).sum(axis=0)
                                - _item_scores(params - unit, x, cut).sum(axis=0)) / (2 * step)
                               for unit in np.eye(2) * step])
    try:
        inverse = np.linalg.inv(-(hessian + hessian.T) / 2)
    except np.linalg.LinAlgError:
        return None
    if not (np.all(np.isfinite(inverse)) and inverse[0, 0] > 0):
        return None
    return float(params[0]), math.exp(params[1]), _item_scores(params, x, cut) @ inverse[0]


def _shift(pairs: Pairs) -> tuple[float, float] | None:
    """The difference of the two sides' censored-normal means of log length and its standard
    error, or None. Each side is fitted on its own, every answer kept (a cut one as at least its
    cut length, on either side); the pairing enters through the error: the variance of the sum
    of the per-pair differences of influence (the sandwich), times n / (n - 1). Without cuts this
    is exactly the paired t-test of the mean log ratio."""
    sides = (pairs.stage, pairs.stage_cut), (pairs.reference, pairs.reference_cut)
    known = [_spread_known(x, cut) for x, cut in sides]
    fits = [_fit(x, cut) if ok else None for (x, cut), ok in zip(sides, known, strict=True)]
    lent = next((fit[1] for fit in fits if fit is not None), FALLBACK_SIGMA)
    fits = [fit if fit is not None else _fit(x, cut, lent)
            for fit, (x, cut) in zip(fits, sides, strict=True)]
    if any(fit is None for fit in fits):
        return None
    (mu_stage, _, stage_influence), (mu_reference, _, reference_influence) = fits
    n = len(pairs.stage)
    difference = stage_influence - reference_influence
    se = math.sqrt(n / (n - 1) * float(difference @ difference))
    return mu_stage - mu_reference, se


def over_censored(cut: int, n: int, most: float, alpha: float) -> bool:
    """More than `most` of one side's `n` answers cut at the budget, confidently: the lower end
    of the share's 1 - 2 alpha Wilson interval lies above it. The cap is on the set's true
    share; read at its point, an equivalent set whose share sits near the cap (20 code items,
    40 % cut) crossed it every other run and left the pooled ratio unbounded."""
    if n == 0:
        return False
    return wilson(cut, n, 1 - 2 * alpha)[0] > most


def cut_at_the_budget(record: StageRecord, policy: GatePolicy) -> list[str]:
    """The sets whose generation budget cut confidently more of this stage's answers than a
    normal fit can carry (length.max_censored_share). Said once the baseline is measured: there,
    lengths are seen only up to the budget, and the length rule can pass a later stage only
    while few of its answers newly reach it; raising the set's max_gen_toks costs one stage."""
    if record.quality is None:
        return []
    most, alpha = policy.length.max_censored_share, policy.quality.alpha
    notes = []
    for name, task in record.quality.tasks.items():
        known = [item for item in task.items if item.output_tokens is not None]
        cut = [item.output_tokens for item in known if item.finish_reason == "length"]
        if known and over_censored(len(cut), len(known), most, alpha):
            notes.append(
                f"{name}: {len(cut) / len(known):.0%} of the answers cut at the budget "
                f"({max(cut)} tokens; a normal fit carries at most {most:.0%}): its lengths are "
                "seen only up to it, and the length rule passes a later stage on it only while "
                "few answers newly reach it; raise its max_gen_toks so the answers fit")
    return notes


def drift(pairs: Pairs, bounds: tuple[float, float], policy: GatePolicy, alpha: float,
          budget_held: bool = False) -> Drift:
    """The censored mean log ratio of one set (see the module docstring) at one-sided level
    `alpha`; `budget_held`: the answers newly cut at the budget are few enough for a restricted
    mean to stand in for a fit."""
    q, most = policy.quality, policy.length.max_censored_share
    ratios, n = pairs.ratios, len(pairs.stage)
    changed, either_cut = pairs.changed, pairs.stage_cut | pairs.reference_cut
    counts = {"n": n, "changed": int(changed.sum()), "cut": int(pairs.stage_cut.sum()),
              "reference_cut": int(pairs.reference_cut.sum())}
    if n < max(2, q.min_items):
        return Drift(float(ratios.mean()) if n else 0.0, -math.inf, math.inf, **counts,
                     p_above=1.0, p_below=1.0, too_few=True,
                     unresolved=f"only {n} pairs with both lengths known (< {q.min_items}): "
                     "cannot decide, fail closed")
    mean, se = float(ratios.mean()), float(ratios.std(ddof=1)) / math.sqrt(n)
    if not either_cut.any():
        return _drift(mean, se, counts, alpha, bounds)
    share = max(pairs.stage_cut.mean(), pairs.reference_cut.mean())
    over = over_censored(int(max(pairs.stage_cut.sum(), pairs.reference_cut.sum())), n, most,
                         alpha)
    spread = (_spread_known(pairs.stage, pairs.stage_cut)
              or _spread_known(pairs.reference, pairs.reference_cut))
    fit = _shift(pairs) if not over and spread else None
    if fit is not None:
        return _drift(*fit, counts, alpha, bounds)
    # Each answer at its cut length: the restricted mean, the ratio within the budget. A pair
    # cut on the stage's side alone reads at most its true ratio, one cut on the reference's side
    # alone at least (both cut: read as equal). So the mean bounds the true one from below when
    # no reference answer alone was cut, from above when no stage answer alone was: only then
    # may it fail for growth, or for shrinking. It passes only while few answers newly ran to
    # the budget.
    low, high, p_above, p_below = _t_interval(mean, se, n, alpha, bounds)
    bounds_below, bounds_above = (not pairs.reference_cut[~pairs.stage_cut].any(),
                                  not pairs.newly_cut.any())
    p_above, p_below = p_above if bounds_below else 1.0, p_below if bounds_above else 1.0
    if budget_held:
        return Drift(mean, low, high, **counts, p_above=p_above, p_below=p_below, se=se,
                     df=n - 1, restricted=True)
    low, high = low if bounds_below else -math.inf, high if bounds_above else math.inf
    why = (f"{share:.0%} of one side's answers cut at the budget, confidently more than a "
           f"normal fit can carry (max {most:.0%})" if over else "neither side's uncut answers show a "
           "spread to fit" if not spread else "the normal fits do not converge")
    bound = (f"; within the budget (each answer at its cut length) the ratio is at least "
             f"x{math.exp(low):.3f}" if math.isfinite(low) else
             f"; within the budget (each answer at its cut length) at most x{math.exp(high):.3f}"
             if math.isfinite(high) else "")
    return Drift(mean, low, high, **counts, p_above=p_above, p_below=p_below,
                 unresolved=f"{why}: cannot pass{bound}")


def _x(log_ratio: float) -> str:
    return f"x{math.exp(log_ratio):.3f}" if math.isfinite(log_ratio) else "unbounded"


def _describe(result: Drift, level: float, reference: str) -> str:
    cut = (f"{result.cut} stage and {result.reference_cut} {reference} answers cut at the budget "
           "(censored: at least their cut length)" if result.cut or result.reference_cut
           else "none cut at the budget")
    return (f"{_x(result.estimate)} ({level:.0%} CI [{_x(result.low)}, {_x(result.high)}]) "
            f"over {result.n} pairs, {result.changed} changed length, {cut}")


def _status(result: Drift, p_holm: float, bounds: tuple[float, float], alpha: float) -> Status:
    if p_holm < alpha:
        return "fail"
    if result.unresolved is None and bounds[0] <= result.low and result.high <= bounds[1]:
        return "pass"
    return "inconclusive"


def _interval(result: Drift) -> dict[str, float]:
    """The interval for the verdict's details, when bounded both ways (JSON has no inf; the
    report and compare read both ends or none)."""
    if math.isfinite(result.low) and math.isfinite(result.high):
        return {"ci_low": result.low, "ci_high": result.high}
    return {"lower_bound": result.low} if math.isfinite(result.low) else {}


def _rule(rule: str, reference_name: str, stage: StageRecord, reference: StageRecord,
          bounds: tuple[float, float], policy: GatePolicy) -> list[Check]:
    """The length rule against one reference: per set and pooled, then one check per set."""
    # The adaptive looks grow the sets while this rule is unresolved, so each look may pass it:
    # its level to pass is split over the planned looks, as accuracy's (x1.10 at 20 % cut went
    # 10 % at the full level over three looks). A fail is a confident drift at the full level
    # (Holm): a stage that drifts stops the looks at once.
    rules, alpha = policy.length, look_alpha(policy.quality.alpha, policy.quality.max_looks)
    level = 1 - 2 * alpha
    sets = {name: Pairs.of(task, stage.quality.tasks.get(name))
            for name, task in reference.quality.tasks.items()}
    if not sets:
        return [missing(rule, f"output length vs the {reference_name}")]
    results = {name: drift(pairs, bounds, policy, alpha) for name, pairs in sets.items()}
    within = [name for name, r in results.items() if r.unresolved and not r.too_few]
    rise = BudgetRise.of([sets[name] for name in within], list(sets.values()), level) \
        if within else None
    held = rise is not None and rise.held(rules.max_length_finish_increase)
    if held:
        results |= {name: drift(sets[name], bounds, policy, alpha, True) for name in within}
    if len(sets) > 1:
        results[POOLED] = pooled_drift(list(results.values()), bounds, alpha)
    adjusted = holm({name: r.p_beyond for name, r in results.items()})
    status = {name: _status(r, adjusted[name], bounds, policy.quality.alpha)
              for name, r in results.items()}
    # The pooled ratio decides the pass (one set's items cannot resolve +-10 % when a changed
    # greedy answer is often a different one: sigma 0.55 per pair); any set's confident drift
    # (Holm) fails on its own, so drift in some sets cannot hide behind unchanged ones.
    pooled_status = status[POOLED] if POOLED in status else next(iter(status.values()))
    overall: Status = "fail" if "fail" in status.values() else pooled_status
    limit = f"limit x{math.exp(bounds[0]):.2f}..x{math.exp(bounds[1]):.2f}"

    budget = (f"; the cut answers at their cut length (the ratio within the budget): "
              f"{rise.describe(level, rules.max_length_finish_increase)}" if held else "")

    def reason(name: str) -> str:
        r = results[name]
        why = f"; {r.unresolved}" if r.unresolved else budget if r.restricted else ""
        holm_note = " (Holm over the sets and all sets)" if len(sets) > 1 else ""
        return (f"{_describe(r, level, reference_name)}{why}; p of lying beyond the limit "
                f"{adjusted[name]:.2g}{holm_note}; {limit}")

    def line(name: str) -> str:
        r = results[name]
        return (f"{name} {_x(r.estimate)} [{_x(r.low)}, {_x(r.high)}] {status[name]}"
                f"{' (' + r.unresolved + ')' if r.unresolved else ''}, p {adjusted[name]:.2g}")

    if len(sets) > 1:
        summary = (f"vs the {reference_name}, all sets {reason(POOLED)}; per set: "
                   + "; ".join(line(name) for name in sets))
    else:
        summary = f"paired length ratio vs the {reference_name} {reason(next(iter(sets)))}"
    shown = results.get(POOLED) or next(iter(results.values()))
    details: dict[str, float | int | str | None] = {
        "n": shown.n, "mean_log_ratio": shown.estimate, **_interval(shown),
        "changed": shown.changed, "cut": shown.cut, "reference_cut": shown.reference_cut,
    } | {f"p_holm.{name}": p for name, p in adjusted.items()}
    checks = [judged(rule, overall, rules.required or shown.too_few, summary,
                     value=shown.estimate, limit=bounds[1], details=details)]
    if len(sets) > 1:
        # A set's own unresolved ratio is shown (the pooled rule decides) unless its estimate
        # lies beyond the limit: then the data lean towards drift there, and what the looks
        # (which grew the set for it) could not clear blocks; a confident drift fails.
        leans = {name: not bounds[0] <= results[name].estimate <= bounds[1] for name in sets}
        checks += [judged(
            f"{rule}.{name}", status[name], rules.required and leans[name],
            f"{name}: paired length ratio vs the {reference_name} {reason(name)}",
            value=results[name].estimate, limit=bounds[1],
            details={"n": results[name].n, "mean_log_ratio": results[name].estimate,
                     **_interval(results[name]), "changed": results[name].changed,
                     "cut": results[name].cut, "reference_cut": results[name].reference_cut,
                     "p_holm": adjusted[name],
                     "leans_beyond": leans[name]},
        ) for name in sets]
    return checks


@dataclass(frozen=True)
class BudgetRise:
    """What ran past the budget against one reference: the answers newly cut in the sets read
    within the budget (`hidden`) with the upper end of their share of all pairs, and over all
    sets the answers newly cut, those no longer cut and the paired rise of the share cut."""

    hidden: int
    hidden_high: float
    newly_cut: int
    no_longer_cut: int
    n: int
    rise: Interval

    @classmethod
    def of(cls, within: list[Pairs], every: list[Pairs], level: float) -> BudgetRise | None:
        before = np.concatenate([p.reference_cut for p in every])
        after = np.concatenate([p.stage_cut for p in every])
        if before.size == 0:
            return None
        hidden = sum(int(p.newly_cut.sum()) for p in within)
        return cls(hidden, wilson(hidden, before.size, level)[1],
                   sum(int(p.newly_cut.sum()) for p in every), int((before & ~after).sum()),
                   int(before.size), paired_rise(before, after, level))

    def held(self, most: float) -> bool:
        return self.hidden_high <= most and self.rise.high <= most

    def describe(self, level: float, most: float) -> str:
        return (f"{self.hidden} of {self.n} answers newly cut at it in the sets so read "
                f"({level:.0%} CI up to {self.hidden_high:.1%}), and over all sets "
                f"{self.newly_cut} newly cut and {self.no_longer_cut} no longer (the share cut "
                f"{points(self.rise.estimate)} pts, up to {points(self.rise.high)}), both within "
                f"{most:.0%}")


def length_ratios(stage: StageRecord, parent: StageRecord) -> dict[str, np.ndarray]:
    """Per set: log(stage tokens / parent tokens) over every pair, each answer at its cut length
    (the rule treats a cut one as censored).

    An empty answer counts as one token: a stage that answers nothing is the largest drift of
    all, not a pair to skip."""
    if stage.quality is None or parent.quality is None:
        return {}
    return {name: Pairs.of(task, stage.quality.tasks.get(name)).ratios
            for name, task in parent.quality.tasks.items()}


def length_checks(stage: StageRecord, parent: StageRecord, policy: GatePolicy,
                  baseline: StageRecord | None = None, finish: bool = True) -> list[Check]:
    """Output length per set vs the parent ("length", first), vs the baseline ("length.baseline",
    the chain as a whole) unless the parent is the baseline, the reasoning traces' length vs the
    parent's ("length.reasoning") where the sets split them off, and (`finish`) the share cut at
    the budget."""
    if stage.quality is None or parent.quality is None:
        return [missing("length", "output length")]
    rules = policy.length
    checks = _rule("length", "parent", stage, parent, rules.log_bounds, policy)
    if baseline is not None and baseline is not parent and baseline.name != parent.name:
        if baseline.quality is None:
            checks.append(missing("length.baseline", "output length of the baseline"))
        else:
            checks += _rule("length.baseline", "baseline", stage, baseline,
                            rules.log_bounds_vs_baseline, policy)
    reasoning = traces(stage), traces(parent)
    if reasoning[0] is not None and reasoning[1] is not None:
        # Quantization changes the thinking length first: the trace is judged as answers are.
        checks += _rule("length.reasoning", "parent's trace", *reasoning, rules.log_bounds, policy)
    return checks + ([_finish_check(stage, parent, policy)] if finish else [])


def traces(record: StageRecord) -> StageRecord | None:
    """The record's reasoning traces as its answers (sets whose items carry reasoning_tokens), a
    trace cut at the budget where the answer never came; None when it has none."""
    if record.quality is None:
        return None
    tasks = {name: task.model_copy(update={"items": [item.model_copy(update={
        "output_tokens": item.reasoning_tokens,
        "finish_reason": "length" if item.finish_reason == "length" and not item.output_tokens
        else "stop"}) for item in task.items]})
        for name, task in record.quality.tasks.items()
        if any(item.reasoning_tokens is not None for item in task.items)}
    if not tasks:
        return None
    return record.model_copy(update={"quality": record.quality.model_copy(update={"tasks": tasks})})


def _finish_check(stage: StageRecord, parent: StageRecord, policy: GatePolicy) -> Check:
    """The share of responses cut off at the generation budget (finish=length) must not rise."""
    rules, q = policy.length, policy.quality
    pairs = [pair for name, task in parent.quality.tasks.items()
             for pair in paired_items(task, stage.quality.tasks.get(name))
             if pair[0].finish_reason and pair[1].finish_reason]
    if len(pairs) < q.min_items:
        return missing("length.finish", "finish_reason", rules.finish_required)
    before = np.array([p.finish_reason == "length" for p, _ in pairs], dtype=float)
    after = np.array([s.finish_reason == "length" for _, s in pairs], dtype=float)
    ci = mean_ci(after - before, q.confidence, q.bootstrap_resamples, q.seed)
    limit = rules.max_length_finish_increase
    outcome: Status = "pass" if ci.high <= limit else "fail" if ci.low > limit else "inconclusive"
    return judged(
        "length.finish", outcome, rules.finish_required,
        f"cut off at the budget: {after.mean():.1%} vs parent {before.mean():.1%} "
        f"({points(ci.estimate)} pts, {q.confidence:.0%} CI [{points(ci.low)}, {points(ci.high)}]); "
        f"limit +{100 * limit:.0f} pts",
        value=ci.estimate, limit=limit,
        details={"stage_rate": float(after.mean()), "parent_rate": float(before.mean()),
                 "ci_low": ci.low, "ci_high": ci.high, "n": len(pairs)},
    )
