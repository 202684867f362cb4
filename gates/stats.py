"""Paired statistics for gates: bootstrap CIs (per item, per token block), McNemar, Holm, the
difference of two paired proportions."""

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


BATCH_VALUES = 1 << 24  # values resampled in one go: 128 MiB of floats


def mean_ci(values: np.ndarray, confidence: float, resamples: int, seed: int) -> Interval:
    """Bootstrap CI of the mean of paired per-item differences (BCa; percentile if degenerate)."""
    values = np.asarray(values, dtype=float)
    estimate = float(values.mean())
    if values.size < 2 or np.all(values == values[0]):
        # Every item moved by the same amount: resampling cannot show any spread.
        return Interval(estimate, estimate, estimate)
    rng = np.random.default_rng(seed)
    # scipy resamples (and BCa's jackknife leaves one out of) every item at once unless batched:
    # n x n floats, GiBs at 10k+ items. Batches draw the same numbers, so small sets are as before.
    batch = None if values.size * max(resamples, values.size) <= BATCH_VALUES else max(
        1, BATCH_VALUES // values.size)
    result = stats.bootstrap((values,), np.mean, confidence_level=confidence, n_resamples=resamples,
                             method="BCa", random_state=rng, batch=batch)
    low, high = result.confidence_interval
    if not (math.isfinite(low) and math.isfinite(high)):
        result = stats.bootstrap((values,), np.mean, confidence_level=confidence,
                                 n_resamples=resamples, method="percentile", random_state=rng,
                                 batch=batch)
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


def corpus_blocks(span_tokens: list[int], block_tokens: int) -> int:
    """How many blocks `block_bootstrap` resamples for a corpus (a block never spans two texts:
    2,000 tokens are 32 blocks of 64 in long texts, more in short ones)."""
    if block_tokens < 1:
        raise ValueError(f"block_tokens must be >= 1, got {block_tokens}")
    return sum(-(-count // block_tokens) for count in span_tokens)


# Each block's tokens are redrawn this many times up front and a resample picks one of the draws
# (with 16 or 256 instead, the benchmark's false-pass rates moved by under a point).
TOKEN_DRAWS = 64


def block_bootstrap(values: np.ndarray, span_tokens: list[int], block_tokens: int,
                    confidence: float, resamples: int, seed: int) -> Interval:
    """CI of the token-weighted mean of per-position values, resampling whole blocks.

    Neighbouring tokens are correlated (one hard passage moves many), so positions are grouped
    into blocks of consecutive positions within one span and the blocks are resampled. Per-token
    KL is extremely skewed (most tokens ~1e-4 nats, a few several nats): a percentile interval of
    such a mean fell below a true mean at the limit 9-12 % of the time on 2,000 simulated tokens,
    for a nominal 2.5 %. So this interval is studentized (bootstrap-t of the ratio sum / count
    over blocks) and two-stage: within each resampled block its tokens are drawn again, so a
    block's few several-nats tokens come back twice or not at all, as in another corpus, and each
    resample's t carries that skew into the bound (1.9-3.8 %: python -m tools.benchmarks.divergence).
    The one interval for per-token KL, top-1 agreement (0/1 values) and NLL differences (log
    perplexity ratio). The bounds stay within the values' range; a single block, with no spread to
    resample, gets all of it.
    """
    values = np.asarray(values, dtype=float)
    if values.size == 0 or values.size != sum(span_tokens):
        raise ValueError(f"block bootstrap: {values.size} values for {sum(span_tokens)} positions")
    labels = blocks(span_tokens, block_tokens)
    sums = np.bincount(labels, weights=values)
    counts = np.bincount(labels).astype(float)
    estimate = float(sums.sum() / counts.sum())
    lowest, highest = min(float(values.min()), estimate), max(float(values.max()), estimate)
    if sums.size < 2:
        return Interval(estimate, lowest, highest)
    if np.allclose(sums, estimate * counts, rtol=0, atol=1e-12):
        return Interval(estimate, estimate, estimate)  # every block alike: no spread to show
    spread = float(_ratio_se(sums, counts))
    # Written out: scipy.stats.bootstrap has neither a studentized nor a two-stage method.
    rng = np.random.default_rng(seed)
    draws = _token_draws(values, labels, counts, rng)
    t = _studentized(draws, counts, estimate, spread, resamples, rng)
    t_low, t_high = np.quantile(t, [(1 - confidence) / 2, (1 + confidence) / 2])
    return Interval(estimate, float(np.clip(estimate - t_high * spread, lowest, highest)),
                    float(np.clip(estimate - t_low * spread, lowest, highest)))


def _token_draws(values: np.ndarray, labels: np.ndarray, counts: np.ndarray,
                 rng: np.random.Generator) -> np.ndarray:
    """(TOKEN_DRAWS, blocks): sums of each block's own tokens drawn with replacement."""
    first = np.concatenate(([0.0], np.cumsum(counts)[:-1]))[labels]  # blocks are contiguous
    size = counts[labels]
    draws = np.empty((TOKEN_DRAWS, counts.size))
    for row in draws:
        picks = (first + np.floor(rng.random(labels.size) * size)).astype(int)
        row[:] = np.bincount(labels, weights=values[picks], minlength=counts.size)
    return draws


def _studentized(draws: np.ndarray, counts: np.ndarray, estimate: float, spread: float,
                 resamples: int, rng: np.random.Generator) -> np.ndarray:
    """t of each resample: blocks drawn with replacement, each as one of its token draws."""
    n = counts.size
    # A resample of only blocks alike (it missed the few that differ: top-1 agreement that is
    # nearly all 1s) has no spread: its t is taken against one block's share of the spread,
    # far out but finite.
    floor = spread / math.sqrt(n)
    t = np.empty(resamples)
    rows = max(1, 1_000_000 // n)  # bounded memory on long corpora
    for start in range(0, resamples, rows):
        shape = (min(rows, resamples - start), n)
        picked = rng.integers(0, n, shape)
        sums, sizes = draws[rng.integers(0, TOKEN_DRAWS, shape), picked], counts[picked]
        ratio = sums.sum(axis=1) / sizes.sum(axis=1)
        t[start:start + shape[0]] = (ratio - estimate) / np.maximum(_ratio_se(sums, sizes), floor)
    return t


def _ratio_se(sums: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Standard error of sum(sums) / sum(counts) over blocks (last axis; linearized, n / (n - 1))."""
    n = sums.shape[-1]
    ratio = sums.sum(axis=-1, keepdims=True) / counts.sum(axis=-1, keepdims=True)
    residual = sums - ratio * counts
    return np.sqrt(n / (n - 1) * np.square(residual).sum(axis=-1)) / counts.sum(axis=-1)


def mcnemar_worse(broke: int, fixed: int) -> float:
    """Exact one-sided McNemar: p of at least `broke` correct->wrong flips if flips were fair coins."""
    if broke + fixed == 0:
        return 1.0
    return float(stats.binomtest(broke, broke + fixed, 0.5, alternative="greater").pvalue)


def paired_rise(before: np.ndarray, after: np.ndarray, confidence: float) -> Interval:
    """The rise in a share on the same items (after minus before, booleans per item) and its
    interval: Newcombe's hybrid score interval for paired proportions (Statistics in Medicine
    1998, method 10), each share's Wilson interval joined through the pairs' phi correlation
    (continuity-corrected).
    Items that moved both ways cancel in the estimate and widen the interval; none moving gives
    the small width of the two Wilson intervals' asymmetry, not a degenerate zero."""
    before, after = np.asarray(before, dtype=bool), np.asarray(after, dtype=bool)
    n = before.size
    if n == 0:
        return Interval(0.0, -1.0, 1.0)
    p1, p2 = float(after.mean()), float(before.mean())
    low1, high1 = wilson(int(after.sum()), n, confidence)
    low2, high2 = wilson(int(before.sum()), n, confidence)
    both, rise = int((after & before).sum()), int((after & ~before).sum())
    fall, neither = int((~after & before).sum()), int((~after & ~before).sum())
    margins = (both + rise) * (fall + neither) * (both + fall) * (rise + neither)
    # phi with Newcombe's continuity correction: a positive association less n / 2, none
    # below that; a negative one kept as it is.
    association = both * neither - rise * fall
    corrected = association - n / 2 if association > n / 2 else min(association, 0)
    phi = corrected / math.sqrt(margins) if margins else 0.0
    below = math.sqrt(max(0.0, (p1 - low1) ** 2 - 2 * phi * (p1 - low1) * (high2 - p2)
                          + (high2 - p2) ** 2))
    above = math.sqrt(max(0.0, (high1 - p1) ** 2 - 2 * phi * (high1 - p1) * (p2 - low2)
                          + (p2 - low2) ** 2))
    return Interval(p1 - p2, max(-1.0, p1 - p2 - below), min(1.0, p1 - p2 + above))


def wilson(successes: int, n: int, confidence: float) -> tuple[float, float]:
    """A share's Wilson score interval (scipy's), as (low, high)."""
    interval = stats.binomtest(successes, n).proportion_ci(confidence, "wilson")
    return float(interval.low), float(interval.high)


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
