"""Paired accuracy non-inferiority: Tango's score interval, stratified over sets, and its power.

Each eval item scored by the baseline and by a stage is a pair; only the discordant pairs carry
information: `broke` (baseline right, stage wrong) and `fixed` (baseline wrong, stage right). The
difference of accuracies is delta = (fixed - broke) / n. Tango's score interval (Stat Med 1998)
inverts the score test of H0: delta = d with the restricted maximum-likelihood estimate of the
discordant rates under H0, so it keeps its level at small n and at zero discordant pairs (where a
bootstrap of 0/1 differences has zero width and a Wald interval collapses).

Several sets are pooled with equal weights (a stratified score statistic, one stratum per set):
delta = mean over sets of each set's delta, variance = mean of each set's restricted variance / n
over the number of sets squared. Equal weights mean a 20-item set that collapses cannot hide
behind a 1,000-item set that held; the price is that small sets dominate the variance, which the
adaptive sample size then pays down.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import optimize, stats


@dataclass(frozen=True)
class Stratum:
    """One set's paired counts against the baseline."""

    n: int
    broke: int
    fixed: int


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


def score_z(strata: list[Stratum] | tuple[np.ndarray, np.ndarray, np.ndarray],
            delta: float) -> np.ndarray | float:
    """Stratified score statistic of H0: delta; large positive = the stage is better than delta.

    `strata` is a list of Stratum, or arrays (n, broke, fixed) of shape (sets,) or (sets, draws).
    """
    if isinstance(strata, list):
        n = np.array([s.n for s in strata], dtype=float)
        broke = np.array([s.broke for s in strata], dtype=float)
        fixed = np.array([s.fixed for s in strata], dtype=float)
    else:
        n, broke, fixed = (np.asarray(x, dtype=float) for x in strata)
    sets = n.shape[0]
    estimate = ((fixed - broke) / n).mean(axis=0)
    q = restricted_broke_rate(n, broke, fixed, delta)
    variance = ((2 * q + delta - delta * delta) / n).sum(axis=0) / sets**2
    with np.errstate(divide="ignore", invalid="ignore"):
        gap = estimate - delta
        z = np.where(variance > 0, gap / np.sqrt(variance),
                     np.where(gap == 0, 0.0, np.sign(gap) * np.inf))
    return float(z) if np.ndim(z) == 0 else z


def estimate(strata: list[Stratum]) -> float:
    return float(np.mean([(s.fixed - s.broke) / s.n for s in strata]))


def score_interval(strata: list[Stratum], one_sided_alpha: float) -> tuple[float, float, float]:
    """(estimate, low, high): each bound is a one-sided (1 - alpha) score bound of delta."""
    if not strata or any(s.n <= 0 for s in strata):
        raise ValueError("a score interval needs at least one set with items")
    point = estimate(strata)
    z = float(stats.norm.ppf(1 - one_sided_alpha))
    eps = 1e-9

    def lower(d: float) -> float:
        return score_z(strata, d) - z

    def upper(d: float) -> float:
        return score_z(strata, d) + z

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
