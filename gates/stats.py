"""Paired statistics for gates: bootstrap CIs (per item, per token block), McNemar, Wilcoxon, Holm."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats


@dataclass(frozen=True)
class Interval:
    estimate: float
    low: float
    high: float


def mean_ci(values: np.ndarray, confidence: float, resamples: int, seed: int) -> Interval:
    """Bootstrap CI of the mean of paired per-item differences (BCa; percentile if degenerate)."""
    values = np.asarray(values, dtype=float)
    estimate = float(values.mean())
    if values.size < 2 or np.all(values == values[0]):
        # Every item moved by the same amount: resampling cannot show any spread.
        return Interval(estimate, estimate, estimate)
    rng = np.random.default_rng(seed)
    result = stats.bootstrap((values,), np.mean, confidence_level=confidence, n_resamples=resamples,
                             method="BCa", random_state=rng)
    low, high = result.confidence_interval
    if not (math.isfinite(low) and math.isfinite(high)):
        result = stats.bootstrap((values,), np.mean, confidence_level=confidence,
                                 n_resamples=resamples, method="percentile", random_state=rng)
        low, high = result.confidence_interval
    return Interval(estimate, float(low), float(high))


def median_ratio_ci(
    stage: np.ndarray, parent: np.ndarray, confidence: float, resamples: int, seed: int
) -> Interval:
    """CI of median(stage) / median(parent) - 1 over independent requests (two-sample bootstrap)."""
    stage, parent = np.asarray(stage, float), np.asarray(parent, float)

    def increase(a: np.ndarray, b: np.ndarray, axis: int = -1) -> np.ndarray:
        return np.median(a, axis=axis) / np.median(b, axis=axis) - 1

    estimate = float(increase(stage, parent))
    result = stats.bootstrap((stage, parent), increase, confidence_level=confidence,
                             n_resamples=resamples, method="percentile", vectorized=True,
                             paired=False, random_state=np.random.default_rng(seed))
    low, high = result.confidence_interval
    return Interval(estimate, float(low), float(high))


def blocks(span_tokens: list[int], block_tokens: int) -> np.ndarray:
    """Block label per position: runs of at most `block_tokens` consecutive positions, never
    crossing from one span (text) into the next."""
    labels, next_label = [], 0
    for count in span_tokens:
        within = np.arange(count) // block_tokens
        labels.append(next_label + within)
        next_label += int(within[-1]) + 1 if count else 0
    return np.concatenate(labels) if labels else np.zeros(0, dtype=int)


def block_bootstrap(values: np.ndarray, span_tokens: list[int], block_tokens: int,
                    confidence: float, resamples: int, seed: int) -> Interval:
    """CI of the token-weighted mean of per-position values, resampling whole blocks.

    Neighbouring tokens are correlated (one hard passage moves many), so positions are grouped
    into blocks of consecutive positions within one span and the blocks are resampled (percentile
    bootstrap of sum / count over blocks). The one interval for per-token KL, top-1 agreement
    (0/1 values) and NLL differences (log perplexity ratio).
    """
    values = np.asarray(values, dtype=float)
    if values.size == 0 or values.size != sum(span_tokens):
        raise ValueError(f"block bootstrap: {values.size} values for {sum(span_tokens)} positions")
    labels = blocks(span_tokens, block_tokens)
    sums = np.bincount(labels, weights=values)
    counts = np.bincount(labels).astype(float)
    estimate = float(sums.sum() / counts.sum())
    if sums.size < 2 or np.allclose(sums, estimate * counts, rtol=0, atol=1e-12):
        return Interval(estimate, estimate, estimate)  # every block alike: no spread to show

    def ratio(s: np.ndarray, c: np.ndarray, axis: int = -1) -> np.ndarray:
        return s.sum(axis=axis) / c.sum(axis=axis)

    result = stats.bootstrap((sums, counts), ratio, paired=True, vectorized=True,
                             n_resamples=resamples, confidence_level=confidence,
                             method="percentile", random_state=np.random.default_rng(seed))
    low, high = result.confidence_interval
    return Interval(estimate, float(low), float(high))


def mcnemar_worse(broke: int, fixed: int) -> float:
    """Exact one-sided McNemar: p of at least `broke` correct->wrong flips if flips were fair coins."""
    if broke + fixed == 0:
        return 1.0
    return float(stats.binomtest(broke, broke + fixed, 0.5, alternative="greater").pvalue)


def wilcoxon_p(differences: np.ndarray) -> float:
    """Two-sided Wilcoxon signed-rank p of paired differences; 1.0 when nothing changed."""
    differences = np.asarray(differences, dtype=float)
    if np.count_nonzero(differences) == 0:
        return 1.0
    return float(stats.wilcoxon(differences, zero_method="wilcox").pvalue)


def holm(pvalues: dict[str, float]) -> dict[str, float]:
    """Holm-Bonferroni adjusted p-values (step-down, monotone), by name."""
    ordered = sorted(pvalues.items(), key=lambda kv: kv[1])
    m = len(ordered)
    adjusted: dict[str, float] = {}
    running = 0.0
    for rank, (name, p) in enumerate(ordered):
        running = max(running, min(1.0, (m - rank) * p))
        adjusted[name] = running
    return adjusted
