"""The sign-off report's figures, drawn with matplotlib from the verdict and the stored records."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from gates.accuracy import natural_order
from gates.context_curve import auc, bucket_length
from gates.diagnosis import BIAS_RATIO, Diagnosis
from gates.length import length_ratios
from gates.record import StageRecord
from gates.repair import KvRepairOption
from gates.verdict import Verdict

STATUS_COLORS = {"pass": "#1a7f37", "fail": "#cf222e", "inconclusive": "#bf8700", "n/a": "#6e7781"}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only: never a window, never a display
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _pyplot().close(fig)
    return path


def forest(verdict: Verdict, path: Path) -> Path | None:
    """Paired accuracy difference vs the baseline per stage and set, with its CI and the margin."""
    rows = [(f"{stage.stage} · {check.rule.split('.', 1)[1]}", check)
            for stage in verdict.stages for check in stage.checks
            if check.rule.startswith("quality.") and "ci_low" in check.details]
    if not rows:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(rows) + 1.4))
    for y, (_, check) in enumerate(reversed(rows)):
        d = check.details
        est, low, high = (100 * float(d[k]) for k in ("difference", "ci_low", "ci_high"))
        color = STATUS_COLORS[check.status or "n/a"]
        ax.errorbar(est, y, xerr=[[est - low], [high - est]], fmt="o", color=color, capsize=4)
        ax.plot([-100 * float(d["margin"])] * 2, [y - 0.35, y + 0.35], color="#cf222e", lw=2)
    ax.axvline(0, color="#57606a", lw=1, ls="--")
    ax.set_yticks(range(len(rows)), [label for label, _ in reversed(rows)])
    ax.set_xlabel("accuracy difference vs baseline, points (95 % CI); red tick: -margin")
    ax.set_title("Paired per-set deltas (colour = check status)")
    return _save(fig, path)


def long_context(records: list[StageRecord], path: Path) -> Path | None:
    """Accuracy per context-length bucket, one line per stage and set.

    Only sets whose groups are all lengths ('512', '4k') are drawn: other grouped sets (business
    item kinds) have no length axis. Stages with the same accuracy would hide each other, so each
    stage's line is drawn a little wider and its markers a little shifted.
    """
    curves = []
    for record in records:
        for name, task in (record.quality.tasks.items() if record.quality else []):
            groups = sorted({i.group for i in task.items if i.group}, key=natural_order)
            if groups and all(natural_order(g)[0] == 0 for g in groups):
                accuracy = [np.mean([i.score >= 0.5 for i in task.items if i.group == g])
                            for g in groups]
                lengths = [bucket_length(g) for g in groups]
                area = f" (AUC {auc(lengths, accuracy):.2f})" if None not in lengths else ""
                curves.append((f"{record.name} · {name}{area}", groups, accuracy))
    if not curves:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.6))
    buckets = sorted({g for _, groups, _ in curves for g in groups}, key=natural_order)
    for index, (label, groups, accuracy) in enumerate(curves):
        shift = 0.06 * (index - (len(curves) - 1) / 2)
        x = [buckets.index(g) + shift for g in groups]
        ax.plot(x, accuracy, marker="o", label=label, linewidth=1.5 + len(curves) - index,
                alpha=0.85)
    ax.set_xticks(range(len(buckets)), buckets)
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("context-length bucket")
    ax.set_ylabel("accuracy")
    ax.set_title("Long-context accuracy per bucket")
    ax.legend(fontsize=8)
    return _save(fig, path)


def latency_cdfs(records: list[StageRecord], path: Path) -> Path | None:
    """Empirical CDFs of TTFT and TPOT at low and high load; emulated stages dashed."""
    levels = ("low", "high")
    if not any(r.load and any(r.load.samples.get(lv) for lv in levels) for r in records):
        return None
    plt = _pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(9, 6))
    for row, (metric, label) in enumerate((("ttft_ms", "TTFT ms"), ("tpot_ms", "TPOT ms"))):
        for col, level in enumerate(levels):
            ax = axes[row][col]
            for record in records:
                values = [getattr(s, metric) for s in (record.load.samples.get(level, [])
                                                      if record.load else []) if not s.error]
                values = np.sort([v for v in values if v is not None])
                if len(values):
                    # From 0 at the fastest request to 1 at the slowest.
                    ax.step(np.r_[values[0], values], np.r_[0, np.arange(1, len(values) + 1)]
                            / len(values), where="post",
                            ls="--" if record.emulated else "-",
                            label=record.name + (" (emulated)" if record.emulated else ""))
            ax.set_ylim(-0.02, 1.02)
            ax.set_title(f"{label}, {level} load")
            ax.set_xlabel(label)
            ax.set_ylabel("share of requests")
            ax.grid(alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    if handles:
        axes[0][0].legend(fontsize=8)
    return _save(fig, path)


def length_histogram(records: list[StageRecord], max_change: float, path: Path) -> Path | None:
    """Per-item output length ratio (stage / parent), all sets; the shaded band is the limit."""
    by_name = {r.name: r for r in records}
    series = []
    for record in records:
        if record.parent and record.parent in by_name and not record.error:
            ratios = length_ratios(record, by_name[record.parent])
            if ratios and any(len(r) for r in ratios.values()):
                series.append((record.name, np.concatenate(list(ratios.values()))))
    if not series:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.6))
    every = np.concatenate([r for _, r in series])
    reach = max(0.3, float(np.max(np.abs(every))) + 0.05)
    bins = np.linspace(-reach, reach, 41)
    for name, ratios in series:
        ax.hist(ratios, bins=bins, histtype="step", lw=2,
                label=f"{name} vs parent (n={len(ratios)})")
    ax.axvspan(math.log(1 - max_change), math.log(1 + max_change), color="#1a7f37", alpha=0.12,
               label=f"±{max_change:.0%}")
    ticks = [t for t in (0.5, 0.67, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0) if abs(math.log(t)) <= reach]
    ax.set_xticks([math.log(t) for t in ticks], [f"x{t:g}" for t in ticks])
    ax.set_xlabel("output length ratio, stage / parent (log scale)")
    ax.set_ylabel("items")
    ax.set_title("Paired output-length ratios")
    ax.legend(fontsize=8)
    return _save(fig, path)


def sensitivity(diagnoses: list[Diagnosis], path: Path) -> Path | None:
    """Per failed stage: KL per layer group, per module kind and per kind within the costliest
    layer groups (the stage's format on that group alone), K vs V per layer, and the share of
    K / V dimensions that are a constant offset; bars are the mean KL per token, whiskers its
    interval (gates.diagnosis)."""
    rows = []
    for diagnosis in diagnoses:
        panels = [sweep for sweep in ("layer", "module", "layer_module", "kv_layer")
                  if diagnosis.sweep(sweep)]
        if diagnosis.kv_offsets:
            panels.append("offsets")
        if diagnosis.repairs:
            panels.append("repair")
        if diagnosis.fidelity is not None:
            panels.append("fidelity")
        if panels:
            rows.append((diagnosis, panels))
    if not rows:
        return None
    plt = _pyplot()
    columns = max(len(panels) for _, panels in rows)
    fig, axes = plt.subplots(len(rows), columns, figsize=(4.6 * columns, 3.4 * len(rows)),
                             squeeze=False)
    for row, (diagnosis, panels) in enumerate(rows):
        for col in range(columns):
            ax = axes[row][col]
            if col >= len(panels):
                ax.axis("off")
                continue
            panel = panels[col]
            if panel == "offsets":
                _offsets_panel(ax, diagnosis)
            elif panel == "repair":
                _repair_panel(ax, diagnosis)
            elif panel == "fidelity":
                _fidelity_panel(ax, diagnosis)
            elif panel == "kv_layer":
                _kv_panel(ax, diagnosis)
            else:
                costs = diagnosis.sweep(panel)
                labels = [c.name.removeprefix("layers ").removeprefix("layer ") for c in costs]
                _bars(ax, labels, costs, 0.0, "#0969da")
                where = {"layer": ("decoder layer(s)", "one layer group"),
                         "module": ("module kind", "one kind, all layers"),
                         "layer_module": ("layer(s) and kind", "one kind of a costly layer")}
                ax.set_xlabel(where[panel][0])
                ax.set_title(f"{diagnosis.stage}: {', '.join(diagnosis.emulated.values())} "
                             f"on {where[panel][1]}", fontsize=9)
            if panel not in ("offsets", "repair"):
                ax.set_ylabel("KL nats/token")
            ax.grid(alpha=0.3, axis="y")
    return _save(fig, path)


def _bars(ax, labels: list[str], costs: list, shift: float, color: str, label: str | None = None,
          width: float = 0.8) -> None:
    x = np.arange(len(costs)) + shift
    means = np.array([c.mean_kl for c in costs])
    errors = np.array([[c.mean_kl - c.ci_low for c in costs], [c.ci_high - c.mean_kl for c in costs]])
    ax.bar(x, means, width=width, color=color, label=label)
    ax.errorbar(x, means, yerr=np.maximum(errors, 0), fmt="none", ecolor="#24292f", capsize=2, lw=1)
    if labels:
        ax.set_xticks(np.arange(len(costs)), labels, rotation=90 if len(labels) > 10 else 30,
                      fontsize=7)


def _repair_panel(ax, diagnosis: Diagnosis) -> None:
    """The repair options measured: emulated KL (interval) against weight MiB (a KV cache's:
    KV bytes per token), the failed configuration, the target and the option chosen."""
    options = diagnosis.repairs
    kv = isinstance(options[0], KvRepairOption)
    unit = 1 if kv else 2**20
    failed = diagnosis.kv_bytes_per_token if kv else diagnosis.weight_bytes
    mib = np.array([o.bytes for o in options]) / unit
    means = np.array([o.mean_kl for o in options])
    errors = np.array([[o.mean_kl - o.ci_low for o in options],
                       [o.ci_high - o.mean_kl for o in options]])
    ax.errorbar(mib, means, yerr=np.maximum(errors, 0), fmt="o", color="#0969da", capsize=2,
                lw=1, label="options measured")
    everything = (diagnosis.sweep("kv_engine") or diagnosis.sweep("kv_all")) if kv \
        else diagnosis.sweep("all")
    if everything and failed:
        ax.plot([failed / unit], [everything[0].mean_kl], "x", color="#cf222e",
                label=f"failed ({', '.join(diagnosis.emulated.values())})")
    if diagnosis.repair_target is not None:
        ax.axhline(diagnosis.repair_target, color="#1a7f37", ls="--", lw=1, label="target")
    if diagnosis.repair is not None:
        ax.plot([diagnosis.repair.bytes / unit], [diagnosis.repair.mean_kl], "o", ms=10,
                mfc="none", color="#1a7f37", label="repair chosen")
    if (np.array([o.ci_low for o in options]) > 0).all():  # over a parent's formats a cost
        ax.set_yscale("log")  # is what an option adds: noise may read below 0, linear then
    else:
        ax.axhline(0, color="#57606a", lw=0.8)
    ax.set_xlabel("KV-cache bytes per token" if kv else "weight MiB")
    ax.set_ylabel("KL nats/token (emulated)")
    ax.set_title(f"{diagnosis.stage}: repairs, KL against bytes", fontsize=9)
    ax.legend(fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=2)


def _fidelity_panel(ax, diagnosis: Diagnosis) -> None:
    """The failed configuration as served and as emulated, on the same tokens and estimator."""
    fidelity = diagnosis.fidelity
    bars = [("served (engine)", fidelity.served), ("emulated", fidelity.emulated)]
    if fidelity.engine is not None:
        bars.append(("emulated as the\nengine's kernel", fidelity.engine))
    _bars(ax, [label for label, _ in bars], [cost for _, cost in bars], 0.0, "#8250df",
          width=0.5)
    ax.axhline(0, color="#57606a", lw=0.8)
    ax.set_title(f"{diagnosis.stage}: KL added over {diagnosis.parent}, served vs emulated\n"
                 f"(the same {fidelity.tokens:,} tokens, top-{fidelity.top_k} coarsened)",
                 fontsize=9)


def _kv_panel(ax, diagnosis: Diagnosis) -> None:
    per_layer = diagnosis.sweep("kv_layer")
    keys = [c for c in per_layer if c.name.startswith("K ")]
    values = [c for c in per_layer if c.name.startswith("V ")]
    _bars(ax, [c.name.removeprefix("K layer ") for c in keys], keys, -0.2, "#cf222e", "K alone",
          0.4)
    _bars(ax, [], values, 0.2, "#0969da", "V alone", 0.4)
    ax.set_xlabel("layer")
    whole = {c.name[0]: c for c in diagnosis.sweep("kv")}
    every = ", ".join(f"{t} {whole[t].mean_kl:.4f} [{whole[t].ci_low:.4f}, {whole[t].ci_high:.4f}]"
                      for t in "KV" if t in whole)
    ax.set_title(f"{diagnosis.stage}: {', '.join(diagnosis.emulated.values())} on K or V of one "
                 f"layer\n(all layers: {every})", fontsize=9)
    ax.legend(fontsize=8)


def _offsets_panel(ax, diagnosis: Diagnosis) -> None:
    layers = sorted({row.layer for row in diagnosis.kv_offsets})
    for tensor, color in (("k", "#cf222e"), ("v", "#0969da")):
        share = [max(getattr(r, f"{tensor}_bias_share") for r in diagnosis.kv_offsets
                     if r.layer == layer) for layer in layers]
        ax.plot(layers, share, marker="o", color=color, label=f"{tensor.upper()} (max over heads)")
        energy = [float(np.median([getattr(r, f"{tensor}_offset_energy") for r in
                                   diagnosis.kv_offsets if r.layer == layer])) for layer in layers]
        ax.plot(layers, energy, ls="--", color=color,
                label=f"{tensor.upper()}: offsets' share of the mean square (median head)")
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("layer")
    ax.set_ylabel("share")
    ax.set_title(f"{diagnosis.stage}: K / V constant offsets (dots: share of dimensions with "
                 f"|mean| > {BIAS_RATIO:g} std)", fontsize=9)
    ax.legend(fontsize=7)
