"""The recovery table of a model card: per set, baseline and candidate score and their ratio.

Recovery is candidate score / baseline score on the items both answered (the table Red Hat's
quantized model cards publish). Its interval is the delta method's: the ratio of means is
linearized into per-cluster influence values (C_g - r B_g) / mean(B), whose mean is 0 at the
estimate, and the bootstrap of their mean (`gates.stats.mean_ci`, the gates' own paired interval)
gives the ratio's spread. Items of a declared cluster move together, so each cluster is one value;
an item without one is its own cluster.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gates.policy import GatePolicy
from gates.record import StageRecord, paired_items
from gates.stats import Interval, mean_ci

AVERAGE = "Average"
EMULATED_NOTE = ("measured on an emulated format: the weights were dequantized and served "
                 "unquantized, so the score is the number format's, not its kernels'")


@dataclass(frozen=True)
class RecoveryRow:
    """One set (or the equal-weight average over sets) of one stage against the baseline."""

    task: str
    metric: str
    baseline: float
    candidate: float
    recovery: Interval | None  # None when the baseline scored 0: no ratio to take
    items: int


@dataclass(frozen=True)
class RecoveryTable:
    stage: str
    emulated: bool
    axes: str
    rows: list[RecoveryRow]
    confidence: float


def _ratio_interval(baseline: np.ndarray, candidate: np.ndarray, weights: np.ndarray,
                    clusters: list[str], policy: GatePolicy) -> Interval | None:
    """Interval of sum(w c) / sum(w b): the linearized ratio, its influence values summed per
    cluster, bootstrapped with the gates' mean_ci."""
    q = policy.quality
    denominator = float(np.sum(weights * baseline))
    if denominator <= 0:
        return None
    ratio = float(np.sum(weights * candidate)) / denominator
    _, cluster = np.unique(np.asarray(clusters), return_inverse=True)
    influence = np.bincount(cluster, weights=weights * (candidate - ratio * baseline))
    # mean(influence) * G / denominator is 0 at the estimate; its interval is the ratio's spread.
    scale = influence.size / denominator
    spread = mean_ci(influence * scale, q.confidence, q.bootstrap_resamples, q.seed)
    return Interval(ratio, ratio + spread.low, ratio + spread.high)


def _pairs(baseline: StageRecord, stage: StageRecord) -> dict[str, tuple[str, list]]:
    """Per set both measured: its metric and the (baseline item, stage item) pairs by item id."""
    out = {}
    for name, task in sorted(baseline.quality.tasks.items()):
        pairs = paired_items(task, stage.quality.tasks.get(name))
        if pairs:
            out[name] = (task.metric, pairs)
    return out


def recovery_table(baseline: StageRecord, stage: StageRecord,
                   policy: GatePolicy) -> RecoveryTable | None:
    """The stage's recovery per set and on average; None when either side has no quality."""
    if baseline.quality is None or stage.quality is None:
        return None
    sets = _pairs(baseline, stage)
    if not sets:
        return None
    rows, pooled = [], []
    for name, (metric, pairs) in sets.items():
        before = np.array([b.score for b, _ in pairs])
        after = np.array([a.score for _, a in pairs])
        clusters = [f"{name}:{b.cluster if b.cluster is not None else 'item:' + b.id}"
                    for b, _ in pairs]
        weights = np.ones(len(pairs))
        rows.append(RecoveryRow(name, metric, float(before.mean()), float(after.mean()),
                                _ratio_interval(before, after, weights, clusters, policy),
                                len(pairs)))
        pooled.append((before, after, weights / len(pairs), clusters))
    if len(rows) > 1:  # each set weighs the same, as the average of the set scores
        before, after, weights = (np.concatenate([p[i] for p in pooled]) for i in range(3))
        clusters = [c for p in pooled for c in p[3]]
        rows.append(RecoveryRow(AVERAGE, "mean of sets", float(np.mean([r.baseline for r in rows])),
                                float(np.mean([r.candidate for r in rows])),
                                _ratio_interval(before, after, weights, clusters, policy),
                                len(before)))
    axes = ", ".join(f"{axis} {value}" for axis, value in stage.axes.items()
                     if baseline.axes.get(axis) != value) or "as the baseline"
    return RecoveryTable(stage.name, stage.emulated, axes, rows, policy.quality.confidence)


def recovery_tables(records: list[StageRecord], policy: GatePolicy) -> list[RecoveryTable]:
    """Every stage against the baseline (the first record), in chain order."""
    if not records or records[0].parent is not None:
        return []
    tables = [recovery_table(records[0], record, policy) for record in records[1:]]
    return [table for table in tables if table is not None]


def _score(value: float) -> str:
    return f"{100 * value:.1f}"


def _recovery(interval: Interval | None) -> str:
    if interval is None:
        return "- (baseline scored 0)"
    return f"{interval.estimate:.1%} [{interval.low:.1%}, {interval.high:.1%}]"


def section(records: list[StageRecord], policy: GatePolicy) -> list[dict]:
    """The report's recovery section: per stage, its formatted rows and the Markdown to paste."""
    return [{"stage": t.stage, "emulated": t.emulated, "axes": t.axes,
             "confidence": f"{t.confidence:.0%}", "markdown": markdown(t),
             "rows": [{"task": r.task, "metric": r.metric, "baseline": _score(r.baseline),
                       "candidate": _score(r.candidate), "recovery": _recovery(r.recovery),
                       "items": r.items} for r in t.rows]}
            for t in recovery_tables(records, policy)]


def markdown(table: RecoveryTable, candidate: str | None = None) -> str:
    """The table as Markdown to paste into a model card; an emulated stage is marked."""
    mark = "†" if table.emulated else ""
    label = candidate or table.stage
    lines = [
        f"| Task | Metric | Baseline | {label}{mark} | Recovery [{table.confidence:.0%} CI] | Items |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for row in table.rows:
        task = f"**{row.task}**" if row.task == AVERAGE else row.task
        lines.append(f"| {task} | {row.metric} | {_score(row.baseline)} | "
                     f"{_score(row.candidate)}{mark} | {_recovery(row.recovery)} | {row.items} |")
    notes = [f"Stage {table.stage} ({table.axes}) against the unquantized baseline, paired on the "
             f"items both answered; scores in percent; recovery = {label} / baseline, with a "
             "delta-method bootstrap interval over items (clusters of near-duplicates together)."]
    if table.emulated:
        notes.append(f"† {EMULATED_NOTE}.")
    return "\n".join(lines) + "\n\n" + "\n\n".join(notes) + "\n"


def model_card(records: list[StageRecord], policy: GatePolicy, candidate: str) -> str | None:
    """The Markdown of the candidate as shipped, the last stage of the chain; None without one."""
    if len(records) < 2 or records[0].parent is not None:
        return None
    final = recovery_table(records[0], records[-1], policy)
    if final is None:
        return None
    return (f"## Accuracy recovery: {candidate}\n\n" + markdown(final, candidate)
            + "\nMeasured by quantgate.\n")
