"""Output-length rules: per set, the paired log length ratio with cut answers as censored values.

Each pair of answers to one item gives r = log((stage tokens + 1) / (reference tokens + 1)), the
reference being the parent and, for the chain as a whole, the baseline. Per set:

- A stage answer cut at the generation budget (finish "length") is right-censored: its true
  length is at least the cut one, so its true r is at least the one observed.
- A pair whose reference answer was cut is set aside. The estimate is of r given the reference's
  length, and choosing pairs by that length leaves the law of r among the rest as it was (no
  bias while the ratio does not depend on how long the reference answered). Counting such a pair
  as left-censored instead, while the pairs where both were cut carry nothing, keeps only the
  ones that shrank: it biases the ratio down and hides growth.
- About half of a quantized stage's greedy answers keep their exact length, a share p0 with
  r = 0 that a single normal misplaces (its tail, where the cut answers lie, comes out too thin:
  x1.10 read as x1.09 at 20 % cut). So the changed pairs get a censored-normal (Tobit) maximum
  likelihood fit of their mean mu1, and the mean log ratio is (1 - p0) * mu1, its standard error
  by the delta method (the fit's observed information, p0's binomial variance) times
  sqrt(n / (n - 1)): without censoring, exactly the paired t-test of the mean.
- A ratio passes when its 1 - 2 alpha interval (Student t, n - 1 degrees of freedom) lies within
  log(1 - limit)..log(1 + limit): two one-sided tests at quality.alpha (Schuirmann), so a ratio
  drifting by exactly the limit passes at most alpha of the time. The pooled ratio (the sets'
  ratios with equal weights, as accuracy pools them, so one large unchanged set cannot dilute
  drift in the others) decides the pass: one set's items cannot resolve +-10 % when a changed greedy answer is
  often a different answer (sigma 0.55 per pair on the demo model). Any set, or the pool, fails
  when its one-sided p of lying beyond the limit, Holm-adjusted over the sets and the pool, is
  below alpha, so drift in some sets cannot hide behind unchanged ones; a set's own unresolved
  ratio is shown, not blocking.
- Fail closed: a set with fewer than quality.min_items kept pairs is inconclusive and blocks
  whatever the policy says. One where more than length.max_censored_share of the changed pairs
  were cut, or too few were left uncut to fit, cannot carry a fit: its ratio is then the
  restricted mean (each cut answer at its cut length, as survival analysis restricts a mean to
  its horizon), which says how lengths moved within the budget and nothing beyond it. It may
  pass only while the answers newly cut at the budget, over all sets against this reference, are
  bounded (the upper end of their 1 - 2 alpha Wilson interval within
  length.max_length_finish_increase): what ran past the budget is then a few answers, not the
  drift (a control whose 2 changed answers of 162 both ran to the budget). Otherwise the ratio is
  only bounded below and fails only when that bound already lies above the limit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
from scipy import optimize, special, stats

from evalsets.results import TaskQuality
from gates.policy import GatePolicy
from gates.record import StageRecord, paired_items
from gates.stats import holm, mean_ci
from gates.verdict import Check, Status, judged, missing, points

POOLED = "all sets"


@dataclass(frozen=True)
class Pairs:
    """One set's paired log ratios: `cut` marks a stage answer cut at the budget (true r >= r)."""

    ratios: np.ndarray
    cut: np.ndarray
    set_aside: int  # pairs whose reference answer was cut: left out

    @classmethod
    def of(cls, reference: TaskQuality, stage: TaskQuality | None) -> Pairs:
        known = [(r, s) for r, s in paired_items(reference, stage)
                 if s.output_tokens is not None and r.output_tokens is not None]
        kept = [(r, s) for r, s in known if r.finish_reason != "length"]
        return cls(np.array([math.log((s.output_tokens + 1) / (r.output_tokens + 1))
                             for r, s in kept], dtype=float),
                   np.array([s.finish_reason == "length" for _, s in kept], dtype=bool),
                   len(known) - len(kept))


@dataclass(frozen=True)
class Drift:
    """The mean log ratio of one set (or all), its interval and the p of lying beyond the limit."""

    estimate: float
    low: float
    high: float
    n: int
    changed: int
    cut: int
    set_aside: int
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
              "cut": sum(r.cut for r in results), "set_aside": sum(r.set_aside for r in results)}
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


def _log_likelihood(params: np.ndarray, exact: np.ndarray, censored: np.ndarray) -> float:
    """Censored-normal log likelihood (up to a constant) of (mu, log sigma): log densities of the
    exact ratios, log survival (scipy.special.log_ndtr) of the censored ones."""
    mu, log_sigma = params
    sigma = math.exp(log_sigma)
    z_exact, z_censored = (exact - mu) / sigma, (censored - mu) / sigma
    return float(-0.5 * z_exact @ z_exact - exact.size * log_sigma
                 + special.log_ndtr(-z_censored).sum())


def _score(params: np.ndarray, exact: np.ndarray, censored: np.ndarray) -> np.ndarray:
    """The gradient of `_log_likelihood` in (mu, log sigma), with the inverse Mills ratio
    phi(z) / Phi(-z) of the censored ratios taken in logs (it stays finite far in the tail)."""
    mu, log_sigma = params
    sigma = math.exp(log_sigma)
    z_exact, z_censored = (exact - mu) / sigma, (censored - mu) / sigma
    mills = np.exp(stats.norm.logpdf(z_censored) - special.log_ndtr(-z_censored))
    return np.array([(z_exact.sum() + mills.sum()) / sigma,
                     z_exact @ z_exact - exact.size + mills @ z_censored])


# The spread of a changed pair's log ratio when too few changed answers were left uncut to
# estimate it: what the real W8A16 stage showed on SmolLM2's math answers (a changed greedy answer
# is often another answer). A near-identical stage (a control: 2 of 39 answers changed, 1 of them
# cut) is then judged on its few changes instead of being unbounded by one cut answer.
FALLBACK_SIGMA = 0.55


def _tobit_fixed_sigma(exact: np.ndarray, censored: np.ndarray) -> tuple[float, float] | None:
    """Censored-normal MLE of the mean with sigma fixed at FALLBACK_SIGMA, and its variance."""
    log_sigma = math.log(FALLBACK_SIGMA)
    start = float(np.concatenate([exact, censored]).mean())
    fit = optimize.minimize_scalar(
        lambda mu: -_log_likelihood(np.array([mu, log_sigma]), exact, censored),
        bracket=(start - 1, start + 1))
    mu, step = float(fit.x), 1e-4
    curvature = (_log_likelihood(np.array([mu + step, log_sigma]), exact, censored)
                 - 2 * _log_likelihood(np.array([mu, log_sigma]), exact, censored)
                 + _log_likelihood(np.array([mu - step, log_sigma]), exact, censored)) / step**2
    if not (math.isfinite(mu) and curvature < 0):
        return None
    return mu, -1 / curvature


def _tobit(ratios: np.ndarray, cut: np.ndarray) -> tuple[float, float] | None:
    """Censored-normal MLE of the mean and its variance (observed information), or None."""
    exact, censored = ratios[~cut], ratios[cut]
    if exact.size < 2 or np.ptp(exact) == 0:
        return _tobit_fixed_sigma(exact, censored)
    start = np.array([ratios.mean(), math.log(ratios.std() + 1e-3)])
    fit = optimize.minimize(lambda p: -_log_likelihood(p, exact, censored), start, method="BFGS",
                            jac=lambda p: -_score(p, exact, censored))
    if not np.all(np.isfinite(fit.x)):
        return None
    step, unit = 1e-4, np.eye(2) * 1e-4
    hessian = np.array([[(_log_likelihood(fit.x + unit[i] + unit[j], exact, censored)
                          - _log_likelihood(fit.x + unit[i] - unit[j], exact, censored)
                          - _log_likelihood(fit.x - unit[i] + unit[j], exact, censored)
                          + _log_likelihood(fit.x - unit[i] - unit[j], exact, censored))
                         / (4 * step**2) for j in range(2)] for i in range(2)])
    try:
        variance = float(np.linalg.inv(-hessian)[0, 0])
    except np.linalg.LinAlgError:
        return None
    return (float(fit.x[0]), variance) if math.isfinite(variance) and variance > 0 else None


def drift(pairs: Pairs, bounds: tuple[float, float], policy: GatePolicy,
          budget_held: bool = False) -> Drift:
    """The censored mean log ratio of one set (see the module docstring); `budget_held`: the
    answers newly cut at the budget are few enough for a restricted mean to stand in for a fit."""
    q, most = policy.quality, policy.length.max_censored_share
    ratios, cut, n = pairs.ratios, pairs.cut, len(pairs.ratios)
    changed = (ratios != 0) | cut
    counts = {"n": n, "changed": int(changed.sum()), "cut": int(cut.sum()),
              "set_aside": pairs.set_aside}
    if n < max(2, q.min_items):
        return Drift(float(ratios.mean()) if n else 0.0, -math.inf, math.inf, **counts,
                     p_above=1.0, p_below=1.0, too_few=True,
                     unresolved=f"only {n} pairs with both lengths known (< {q.min_items}): "
                     "cannot decide, fail closed")
    mean, se = float(ratios.mean()), float(ratios.std(ddof=1)) / math.sqrt(n)
    if not cut.any():
        return _drift(mean, se, counts, q.alpha, bounds)
    share = cut.sum() / changed.sum()
    fit = _tobit(ratios[changed], cut[changed]) if share <= most else None
    if fit is None:
        # At their cut length the censored ratios are lower bounds: the restricted mean, which
        # passes only while few answers newly ran to the budget, and never fails for shrinking.
        low, high, p_above, _ = _t_interval(mean, se, n, q.alpha, bounds)
        if budget_held:
            return Drift(mean, low, high, **counts, p_above=p_above, p_below=1.0, se=se,
                         df=n - 1, restricted=True)
        why = (f"more than the normal fit can carry (max {most:.0%})" if share > most else
               "too few uncut changed answers to fit")
        return Drift(mean, low, math.inf, **counts, p_above=p_above, p_below=1.0,
                     unresolved=f"{cut.sum()} of {changed.sum()} changed answers ({share:.0%}) cut "
                     f"at the budget, {why}: the ratio is only bounded below, by "
                     f"x{math.exp(low):.3f} with the cut answers at their cut length")
    mu_changed, variance = fit
    same = 1 - changed.mean()
    mean = (1 - same) * mu_changed
    se = math.sqrt(n / (n - 1) * (mu_changed**2 * same * (1 - same) / n
                                  + (1 - same)**2 * variance))
    return _drift(mean, se, counts, q.alpha, bounds)


def _x(log_ratio: float) -> str:
    return f"x{math.exp(log_ratio):.3f}" if math.isfinite(log_ratio) else "unbounded"


def _describe(result: Drift, level: float, reference: str) -> str:
    cut = (f"{result.cut} stage answers cut at the budget (censored: ratio at least the cut one)"
           if result.cut else "none cut at the budget")
    aside = (f", {result.set_aside} pairs set aside whose {reference} answer was cut (censored: "
             f"its length unknown)" if result.set_aside else "")
    return (f"{_x(result.estimate)} ({level:.0%} CI [{_x(result.low)}, {_x(result.high)}]) "
            f"over {result.n} pairs, {result.changed} changed length, {cut}{aside}")


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
    rules, alpha = policy.length, policy.quality.alpha
    level = 1 - 2 * alpha
    sets = {name: Pairs.of(task, stage.quality.tasks.get(name))
            for name, task in reference.quality.tasks.items()}
    if not sets:
        return [missing(rule, f"output length vs the {reference_name}")]
    newly_cut = _newly_cut(list(sets.values()), policy)
    held = newly_cut is not None and newly_cut[2] <= rules.max_length_finish_increase
    results = {name: drift(pairs, bounds, policy, held) for name, pairs in sets.items()}
    if len(sets) > 1:
        results[POOLED] = pooled_drift(list(results.values()), bounds, alpha)
    adjusted = holm({name: r.p_beyond for name, r in results.items()})
    status = {name: _status(r, adjusted[name], bounds, alpha) for name, r in results.items()}
    # The pooled ratio decides the pass (one set's items cannot resolve +-10 % when a changed
    # greedy answer is often a different one: sigma 0.55 per pair); any set's confident drift
    # (Holm) fails on its own, so drift in some sets cannot hide behind unchanged ones.
    pooled_status = status[POOLED] if POOLED in status else next(iter(status.values()))
    overall: Status = "fail" if "fail" in status.values() else pooled_status
    limit = f"limit x{math.exp(bounds[0]):.2f}..x{math.exp(bounds[1]):.2f}"

    budget = (f"; the cut answers at their cut length (the ratio within the budget), with "
              f"{newly_cut[0]} of {newly_cut[1]} answers newly cut at it ({level:.0%} CI up to "
              f"{newly_cut[2]:.1%}, within {rules.max_length_finish_increase:.0%})"
              if newly_cut and held else "")

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
        "changed": shown.changed, "cut": shown.cut, "set_aside": shown.set_aside,
    } | {f"p_holm.{name}": p for name, p in adjusted.items()}
    checks = [judged(rule, overall, rules.required or shown.too_few, summary,
                     value=shown.estimate, limit=bounds[1], details=details)]
    if len(sets) > 1:
        # A set's own unresolved ratio is shown (the pooled rule decides); its drift fails.
        checks += [judged(
            f"{rule}.{name}", status[name], False,
            f"{name}: paired length ratio vs the {reference_name} {reason(name)}",
            value=results[name].estimate, limit=bounds[1],
            details={"n": results[name].n, "mean_log_ratio": results[name].estimate,
                     **_interval(results[name]), "changed": results[name].changed,
                     "cut": results[name].cut, "set_aside": results[name].set_aside,
                     "p_holm": adjusted[name]},
        ) for name in sets]
    return checks


def _newly_cut(sets: list[Pairs], policy: GatePolicy) -> tuple[int, int, float] | None:
    """Stage answers cut at the budget where the reference's was not, over all kept pairs: the
    count, the pairs, and the upper end of the share's 1 - 2 alpha Wilson interval."""
    cut, n = sum(int(p.cut.sum()) for p in sets), sum(len(p.ratios) for p in sets)
    if n == 0:
        return None
    interval = stats.binomtest(cut, n).proportion_ci(1 - 2 * policy.quality.alpha, "wilson")
    return cut, n, float(interval.high)


def length_ratios(stage: StageRecord, parent: StageRecord) -> dict[str, np.ndarray]:
    """Per set: log((stage tokens + 1) / (parent tokens + 1)) over the pairs the rule keeps.

    The +1 keeps empty answers in: a stage that answers nothing is the largest drift of all, not a
    pair to skip. Pairs whose parent answer was cut are left out; a stage answer cut at the budget
    counts at its cut length here (a lower bound of its ratio: the rule treats it as censored)."""
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
