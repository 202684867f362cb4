"""Accuracy per context length and its area under the curve, for the sign-off report.

A set whose groups are all lengths ('512', '1k', '8k'; 1k = 1024 tokens) has a curve: accuracy
per bucket against log2 of the bucket's length. Its AUC is the trapezoid area under that curve
divided by the width of the length axis, so it reads as an accuracy (1.0: right at every
length) and weighs each doubling of the context alike. A stage's AUC change against the baseline
is computed on the items both answered, bucket by bucket, with a normal-approximation interval
(the AUC is a weighted sum of per-bucket means, so its variance is the weighted sum of theirs).
Descriptive: the gates judge the buckets themselves (quality.<set>.<bucket>).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np
from scipy import stats

from evalsets.results import TaskQuality
from gates.accuracy import correct
from gates.record import StageRecord

_LENGTH = re.compile(r"(\d+)([kK]?)")
CONFIDENCE = 0.95


def bucket_length(label: str) -> int | None:
    """'8k' -> 8192, '512' -> 512; None when the label is not a length (a business item kind)."""
    found = _LENGTH.fullmatch(label.strip())
    if found is None:
        return None
    return int(found.group(1)) * (1024 if found.group(2) else 1)


def weights(lengths: list[int]) -> np.ndarray:
    """Trapezoid weights over log2(length), normalised to sum to 1 (one bucket: weight 1)."""
    if len(lengths) == 1:
        return np.ones(1)
    x = np.log2(lengths)
    gaps = np.diff(x)
    w = np.zeros(len(x))
    w[:-1] += gaps / 2
    w[1:] += gaps / 2
    return w / (x[-1] - x[0])


def auc(lengths: list[int], accuracy: list[float]) -> float:
    return float(weights(lengths) @ np.asarray(accuracy, dtype=float))


@dataclass(frozen=True)
class Curve:
    """One stage's accuracy per bucket of one set (buckets shortest first)."""

    stage: str
    task: str
    buckets: list[str]
    accuracy: list[float]
    items: list[int]

    @property
    def lengths(self) -> list[int]:
        return [bucket_length(b) or 0 for b in self.buckets]

    @property
    def auc(self) -> float:
        return auc(self.lengths, self.accuracy)


def _by_bucket(task: TaskQuality) -> dict[str, dict[str, bool]] | None:
    """Item correctness by id, per bucket; None when the set's groups are not all lengths."""
    groups: dict[str, dict[str, bool]] = {}
    for item in task.items:
        if item.group is None or bucket_length(item.group) is None:
            return None
        groups.setdefault(item.group, {})[item.id] = correct(item)
    return dict(sorted(groups.items(), key=lambda kv: bucket_length(kv[0]))) or None


def curve(stage: str, name: str, task: TaskQuality) -> Curve | None:
    buckets = _by_bucket(task)
    if buckets is None:
        return None
    return Curve(stage, name, list(buckets), [float(np.mean(list(v.values())))
                                              for v in buckets.values()],
                 [len(v) for v in buckets.values()])


def auc_change(stage: TaskQuality, baseline: TaskQuality) -> tuple[float, float, float] | None:
    """(change, low, high) of the AUC, stage minus baseline, on the items both answered in the
    buckets both have; None without a shared bucket or with a bucket of fewer than two pairs."""
    mine, theirs = _by_bucket(stage), _by_bucket(baseline)
    if mine is None or theirs is None:
        return None
    shared = [b for b in mine if b in theirs]
    differences = []
    for bucket in shared:
        ids = sorted(set(mine[bucket]) & set(theirs[bucket]))
        if len(ids) < 2:
            return None
        differences.append(np.array([int(mine[bucket][i]) - int(theirs[bucket][i]) for i in ids]))
    if not differences:
        return None
    w = weights([bucket_length(b) for b in shared])
    change = float(sum(wb * d.mean() for wb, d in zip(w, differences, strict=True)))
    spread = math.sqrt(sum(wb**2 * d.var(ddof=1) / len(d) for wb, d in zip(w, differences,
                                                                            strict=True)))
    z = float(stats.norm.ppf(0.5 + CONFIDENCE / 2))
    return change, change - z * spread, change + z * spread


def curve_tables(records: list[StageRecord]) -> list[dict]:
    """Per length-bucketed set: its buckets and, per stage, accuracy (items) per bucket, AUC and
    the AUC change against the baseline with its interval (report.html / report.md)."""
    baseline = next((r for r in records if r.parent is None and r.quality), None)
    tables: dict[str, dict] = {}
    for record in records:
        for name, task in (record.quality.tasks.items() if record.quality else []):
            found = curve(record.name, name, task)
            if found is None:
                continue
            table = tables.setdefault(name, {"set": name, "buckets": [], "rows": []})
            table["buckets"] = sorted(set(table["buckets"]) | set(found.buckets),
                                      key=bucket_length)
            base = baseline.quality.tasks.get(name) if baseline and record is not baseline else None
            change = auc_change(task, base) if base is not None else None
            cells = dict(zip(found.buckets, zip(found.accuracy, found.items, strict=True),
                             strict=True))
            table["rows"].append({"stage": record.name, "cells": cells, "auc": f"{found.auc:.2f}",
                                  "change": "-" if change is None else
                                  f"{100 * change[0]:+.1f} [{100 * change[1]:+.1f}, "
                                  f"{100 * change[2]:+.1f}]"})
    for table in tables.values():
        for row in table["rows"]:
            row["cells"] = [f"{row['cells'][b][0]:.0%} ({row['cells'][b][1]})"
                            if b in row["cells"] else "-" for b in table["buckets"]]
    return list(tables.values())
