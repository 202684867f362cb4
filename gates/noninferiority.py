"""Paired accuracy non-inferiority: Tango's score interval, stratified over sets, and its power.

Each eval item scored by the baseline and by a stage is a pair; only the discordant pairs carry
information: `broke` (baseline right, stage wrong) and `fixed` (baseline wrong, stage right). The
difference of accuracies is delta = (fixed - broke) / n. Tango's score interval (Stat Med 1998)
inverts the score test of H0: delta = d with the restricted maximum-likelihood estimate of the
discordant rates under H0, so it keeps its level at small n and at zero discordant pairs (where a
bootstrap of 0/1 differences has zero width and a Wald interval collapses).

Strata are pooled with fixed weights (a stratified score statistic): delta = sum of w_i delta_i,
variance = sum of w_i^2 * deff_i * restricted variance_i / n_i. Sets get equal weights, so a 20-item
set that collapses cannot hide behind a 1,000-item set that held (small sets then dominate the
variance, which the adaptive sample size pays down); within a set its groups (the long-context
length buckets) are strata weighted by their items, so the set's difference is its plain paired
difference while its variance is the stratified one.

Clustered items (near-duplicates: one template, one source document) are not independent. Where
a set declares clusters, each stratum's variance is inflated by its design effect, the ratio of
the cluster-robust (sandwich) variance of the paired differences to the independent one (never
below 1): the Rao-Scott adjustment of a score test, so the interval is as wide as the effective
number of independent items warrants.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
from scipy import optimize, stats


@dataclass(frozen=True)
class Stratum:
    """One set's paired counts against the baseline."""

    n: int
    broke: int
    fixed: int
    weight: float = 1.0  # relative weight in the pooled difference (normalised over the strata)
    design_effect: float = 1.0  # variance inflation from clustered items, >= 1


def design_effect(differences: list[int], clusters: list[str]) -> float:
    """Cluster-robust over independent variance of the mean paired difference (>= 1).

    `differences` are per item stage minus baseline (-1, 0, 1); `clusters` name each item's
    cluster. With every item its own cluster, or no spread at all, the effect is 1."""
    if len(set(clusters)) == len(clusters):
        return 1.0
    values = np.asarray(differences, dtype=float)
    centred = values - values.mean()
    independent = float(np.sum(centred**2))
    if independent == 0:
        return 1.0
    _, index = np.unique(np.asarray(clusters), return_inverse=True)
    groups = int(index.max()) + 1
    # G / (G - 1): the sandwich estimator's small-sample correction (few clusters read too low).
    robust = float(np.sum(np.bincount(index, weights=centred) ** 2)) * groups / max(1, groups - 1)
    return max(1.0, robust / independent)


def restricted_broke_rate(n: np.ndarray, broke: np.ndarray, fixed: np.ndarray,
                          delta: float) -> np.ndarray:
    """MLE of P(broke) under delta = P(fixed) - P(broke) (Tango 1998, closed form)."""
    n, broke, fixed = (np.asarray(x, dtype=float) for x in (n, broke, fixed))
    same = n - broke - fixed
    a = 2 * n
    b = -(fixed * (1 - delta) + broke * (1 - 3 * delta) - 2 * same * delta)
    c = -broke * delta * (1 - delta)
    q = (-b + np.sqrt(np.maximum(b * b - 4 * a * c, 0.0))) / (2 * a)
    low, high = max(0.0, -delta), (1 - delta) / 2
    return np.clip(q, low, high)


def _weights(strata: list[Stratum]) -> tuple[np.ndarray, np.ndarray]:
    weights = np.array([s.weight for s in strata], dtype=float)
    return weights / weights.sum(), np.array([s.design_effect for s in strata], dtype=float)


def score_z(strata: list[Stratum] | tuple[np.ndarray, np.ndarray, np.ndarray],
            delta: float) -> np.ndarray | float:
    """Stratified score statistic of H0: delta; large positive = the stage is better than delta.

    `strata` is a list of Stratum (weighted, with design effects), or arrays (n, broke, fixed) of
    shape (sets,) or (sets, draws), pooled with equal weights.
    """
    return _z(_arrays(strata), delta)


def _arrays(strata: list[Stratum] | tuple[np.ndarray, np.ndarray, np.ndarray]
            ) -> tuple[np.ndarray, ...]:
    """(n, broke, fixed, weights, inflation) as arrays, read once for every delta a root
    search asks."""
    if isinstance(strata, list):
        n = np.array([s.n for s in strata], dtype=float)
        broke = np.array([s.broke for s in strata], dtype=float)
        fixed = np.array([s.fixed for s in strata], dtype=float)
        weights, inflation = _weights(strata)
    else:
        n, broke, fixed = (np.asarray(x, dtype=float) for x in strata)
        weights, inflation = np.full(n.shape[0], 1 / n.shape[0]), np.ones(n.shape[0])
    if n.ndim == 2:
        weights, inflation = weights[:, None], inflation[:, None]
    return n, broke, fixed, weights, inflation


def _z(arrays: tuple[np.ndarray, ...], delta: float) -> np.ndarray | float:
    n, broke, fixed, weights, inflation = arrays
    estimate = (weights * (fixed - broke) / n).sum(axis=0)
    q = restricted_broke_rate(n, broke, fixed, delta)
    variance = (weights**2 * inflation * (2 * q + delta - delta * delta) / n).sum(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        gap = estimate - delta
        z = np.where(variance > 0, gap / np.sqrt(variance),
                     np.where(gap == 0, 0.0, np.sign(gap) * np.inf))
    return float(z) if np.ndim(z) == 0 else z


def estimate(strata: list[Stratum]) -> float:
    weights, _ = _weights(strata)
    return float(sum(w * (s.fixed - s.broke) / s.n for w, s in zip(weights, strata, strict=True)))


def score_interval(strata: list[Stratum], one_sided_alpha: float) -> tuple[float, float, float]:
    """(estimate, low, high): each bound is a one-sided (1 - alpha) score bound of delta."""
    if not strata or any(s.n <= 0 for s in strata):
        raise ValueError("a score interval needs at least one set with items")
    return _score_interval(tuple(strata), one_sided_alpha)


# Counts repeat (a set's broke/fixed at a look, the same at every rule and trial that asks): the
# interval is a pure function of them, and two root searches each time it is asked.
@functools.lru_cache(maxsize=1 << 16)
def _score_interval(strata: tuple[Stratum, ...], one_sided_alpha: float
                    ) -> tuple[float, float, float]:
    strata = list(strata)
    point = estimate(strata)
    z = float(stats.norm.ppf(1 - one_sided_alpha))
    eps = 1e-9

    arrays = _arrays(strata)

    def lower(d: float) -> float:
        return _z(arrays, d) - z

    def upper(d: float) -> float:
        return _z(arrays, d) + z

    low = -1 + eps if lower(-1 + eps) <= 0 else optimize.brentq(lower, -1 + eps, point)
    high = 1 - eps if upper(1 - eps) >= 0 else optimize.brentq(upper, point, 1 - eps)
    return point, float(low), float(high)


def look_alpha(alpha: float, looks: int) -> float:
    """Alpha spent at each of `looks` planned looks (Bonferroni): over all looks together the
    chance of a false go (or a false fail) stays within alpha however the looks turn out."""
    return alpha / max(1, looks)


def simulated_power(sizes: list[int], margin: float, discordance: float, alpha: float,
                    true_delta: float = 0.0, draws: int = 20_000, seed: int = 0) -> float:
    """P(pass) of the test actually run: the stratified score test at the margin, one-sided at
    `alpha`, on sets of these sizes, when each item flips with the planning `discordance` and the
    true difference is `true_delta` (0: a stage as good as the baseline).

    Exact enumeration of every set's (broke, fixed) outcomes is a product of trinomials
    (~10^9 combinations for four sets), so the test itself is run on `draws` seeded outcomes:
    the standard error of the figure is below 0.4 points.
    """
    rng = np.random.default_rng(seed)
    p_broke = (discordance - true_delta) / 2
    p_fixed = (discordance + true_delta) / 2
    if p_broke < 0 or p_fixed < 0 or discordance > 1:
        raise ValueError(f"discordance {discordance} cannot hold a true difference {true_delta}")
    n = np.array(sizes, dtype=float)[:, None] * np.ones((1, draws))
    outcomes = np.stack([rng.multinomial(size, [p_broke, p_fixed, 1 - discordance], size=draws)
                         for size in sizes])
    z = score_z((n, outcomes[:, :, 0], outcomes[:, :, 1]), -margin)
    return float(np.mean(z >= stats.norm.ppf(1 - alpha)))


def ratio_z(n: int, both: int, only_first: int, only_second: int, theta: float,
            design_effect: float = 1.0) -> float:
    """Score statistic of H0: P(second) = theta * P(first), the marginal rates of one event (an
    error) on matched pairs; negative: the second's rate is below theta times the first's.

    `both`: pairs where the event happened on both sides; `only_first`, `only_second`: on one.
    The variance is the restricted MLE's under H0 (the score test of Nam & Blackwelder 2002 and
    Tang, Tang & Chan 2003 for the ratio of paired proportions), so it keeps its level with a
    handful of events, where the rate it compares against is itself uncertain: a ceiling set's
    "at most 2.5x the baseline's errors" is judged against the baseline's true error rate, not
    against the few errors its sample happened to have. `design_effect` inflates the variance of
    clustered items as it does the difference's."""
    if theta <= 1:
        raise ValueError(f"theta must exceed 1, got {theta}")
    return _ratio_z(n, both, only_first, only_second, float(theta), float(design_effect))


@functools.lru_cache(maxsize=1 << 16)
def _ratio_z(n: int, both: int, only_first: int, only_second: int, theta: float,
             design_effect: float) -> float:
    # A tiny pseudo-count per cell keeps the restricted MLE inside the simplex at empty cells.
    a, b, c = both + 1e-6, only_first + 1e-6, only_second + 1e-6
    total = n + 3e-6

    def constraint(mu: float) -> float:  # P(second) - theta * P(first) at the Lagrange point
        return c / (total + mu) - theta * b / (total - mu * theta) - (theta - 1) * a / (
            total - mu * (theta - 1))

    edge = total * 1e-12
    mu = optimize.brentq(constraint, -total + edge, total / theta - edge, xtol=1e-12 * total)
    p_both = a / (total - mu * (theta - 1))
    p_first = b / (total - mu * theta)
    p_second = c / (total + mu)
    variance = ((theta - 1) ** 2 * p_both + theta**2 * p_first + p_second) * design_effect
    gap = (only_second - theta * only_first - (theta - 1) * both) / n
    if variance <= 0:
        return 0.0 if gap == 0 else float(np.sign(gap) * np.inf)
    return float(gap / np.sqrt(variance / n))
