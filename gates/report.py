"""The sign-off report: HTML + Markdown (jinja2) with matplotlib figures, from a verdict and its records."""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gates import plots, recovery, rules
from gates.context_curve import curve_tables
from gates.diagnosis import Diagnosis, summary
from gates.engine_facts import engine_rows, kernel_changes
from gates.methods import methods
from gates.policy import GatePolicy
from gates.record import StageRecord
from gates.verdict import RepairVerdict, StageVerdict, Verdict
from gates.whatif.search import Workload
from gates.whatif.section import DEFAULT_GPUS, whatif_section

if TYPE_CHECKING:
    from evalsets.spec import EvalSetInfo
    from infra.placement import Placement

TEMPLATES = Path(__file__).with_name("templates")
MAX_FLIPS_SHOWN = 40


def _headline(stage: StageVerdict, set_names: list[str]) -> dict[str, Any]:
    """One row of the per-stage table: every registered rule's cells (gates/rules/)."""
    cells: dict[str, dict[str, str]] = {}
    for rule in rules.registered():
        cells |= rule.cells(stage, set_names)
    return {"stage": stage, "cells": cells}


def _prompts(set_name: str) -> dict[str, str]:
    """Prompt text by item id from a built-in eval set's data as it is now (records keep only a
    prompt hash); a user's set shows hashes unless its prompts are given (`set_prompts`, or the
    run's kept ones, gates.run_inputs)."""
    from evalsets.spec import registry

    info = registry().get(set_name)
    data = info.folder / "data.jsonl" if info else None
    try:
        if not data or not data.is_file():
            return {}
        prompts = {}
        for line in data.read_text().splitlines():
            row = json.loads(line)
            text = next((row[k] for k in ("question", "prompt", "input", "text") if k in row), None)
            if "id" in row and text is not None:
                prompts[str(row["id"])] = str(text)
        return prompts
    except (OSError, ValueError):
        return {}


def set_prompts(sets: dict[str, EvalSetInfo]) -> Callable[[str], dict[str, str]]:
    """Prompt texts by item id for the sets a spec declares (a user's data file read as its
    scorer's set sends it: a dialogue turn by turn), else a built-in set's."""
    from evalsets.contracts import prompts_by_id
    from infra.errors import QuantgateError

    def prompts(set_name: str) -> dict[str, str]:
        info = sets.get(set_name)
        if info is None or info.data_file is None:
            return _prompts(set_name)
        try:
            return prompts_by_id(info)
        except (OSError, ValueError, QuantgateError):
            return {}

    return prompts


def flipped_items(records: list[StageRecord],
                  prompts: Callable[[str], dict[str, str]] = _prompts) -> list[dict[str, Any]]:
    """Per stage, the items whose score crossed 0.5 against the parent, with both responses;
    `prompts(set)` gives a set's prompt texts by id (default: from the set's data as it is now)."""
    by_name = {r.name: r for r in records}
    out = []
    for record in records:
        parent = by_name.get(record.parent or "")
        if not parent or not record.quality or not parent.quality:
            continue
        rows = []
        for name, parent_task in parent.quality.tasks.items():
            task = record.quality.tasks.get(name)
            if task is None:
                continue
            texts = prompts(name)
            mine = {i.id: i for i in task.items}
            for before in parent_task.items:
                after = mine.get(before.id)
                if after is None or (before.score >= 0.5) == (after.score >= 0.5):
                    continue
                rows.append({
                    "set": name, "id": before.id, "group": before.group,
                    "direction": "correct->wrong" if before.score >= 0.5 else "wrong->correct",
                    "prompt": texts.get(before.id, f"(prompt not stored; sha256 {before.prompt_hash})"),
                    "parent_response": before.response, "stage_response": after.response,
                })
        rows.sort(key=lambda r: (r["direction"] != "correct->wrong", r["set"], r["id"]))
        out.append({"stage": record.name, "parent": parent.name, "count": len(rows),
                    "broke": sum(r["direction"] == "correct->wrong" for r in rows),
                    "rows": rows[:MAX_FLIPS_SHOWN]})
    return out


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} s"


def timing_rows(records: list[StageRecord], run: str) -> list[dict[str, str]]:
    """Where each stage's wall time went (stage.json `timings`); a stage from the stage cache
    cost this run nothing, its figures are from the run that measured it."""
    rows = []
    for record in records:
        t = record.timings
        if t is None:
            continue
        sets = ", ".join(f"{name} {timing.seconds:.0f} s first look ({timing.items} items, "
                         f"{timing.output_tokens} tokens in all)"
                         for name, timing in t.sets.items() if timing.seconds is not None)
        rows.append({
            "stage": record.name, "origin": reused_from(record, run) or "measured in this run",
            "wall": _seconds(t.wall_s), "startup": _seconds(t.startup_s), "sets": sets or "-",
            "scoring": _seconds(t.scoring_s), "more": _seconds(t.more_items_s),
            "load": _seconds(t.load_s), "overhead": _seconds(t.overhead_s),
            "busy": f"{t.busy_s / t.wall_s:.0%}" if t.wall_s else "-"})
    return rows


def _ms(value: float | None) -> str:
    return f"{value:,.0f}" if value is not None else "-"


def load_rows(records: list[StageRecord]) -> list[dict[str, str]]:
    """Per stage and level: latency percentiles, throughput, goodput; then the capacity."""
    rows = []
    for record in records:
        load = record.load
        if load is None:
            rows.append({"stage": record.name, "level": "-", "note": record.error or "not measured"})
            continue
        for level, s in load.summaries.items():
            rows.append({
                "stage": record.name + (" (emulated)" if record.emulated else ""),
                "level": f"{level} (c={s.users})", "requests": f"{s.requests} ({s.errors} err)",
                "ttft": f"{_ms(s.ttft_p50_ms)} / {_ms(s.ttft_p99_ms)}",
                "tpot": f"{_ms(s.tpot_p50_ms)} / {_ms(s.tpot_p99_ms)}",
                "itl": _ms(s.itl_p50_ms), "e2e": _ms(s.e2e_p50_ms),
                "tokens": f"{s.output_tokens_per_s:.1f}",
                "goodput": f"{s.goodput:.0%}" if s.goodput is not None else "-",
                "note": "",
            })
        if load.capacity_note:
            capacity = (f"{load.capacity_rps:.3g} req/s" if load.capacity_rps is not None
                        else "none")
            rows.append({"stage": record.name, "level": "capacity at the SLO",
                         "note": f"{capacity}: {load.capacity_note}"})
    return rows


def core_lines(records: list[StageRecord]) -> list[dict[str, Any]]:
    """Where the load generator ran against the engine, one line per distinct plan (stages that
    ran alike share a line); shared cores first: their latency includes the client's overhead."""
    lines: dict[str, dict[str, Any]] = {}
    for record in records:
        if record.load is None:
            continue
        sentence = record.load.cores_sentence()
        line = lines.setdefault(sentence, {"sentence": sentence, "stages": [],
                                           "shared": record.load.cores_shared})
        line["stages"].append(record.name)
    return sorted(lines.values(), key=lambda line: not line["shared"])


def measured_elsewhere(record: StageRecord, run: str) -> str | None:
    """For a stage the stage cache restored into `run`: the run and time that measured it."""
    if not record.measured_in or record.measured_in == run:
        return None
    return f"measured in run {record.measured_in} at {record.measured_at or '(time not kept)'}"


def reused_from(record: StageRecord, run: str) -> str | None:
    elsewhere = measured_elsewhere(record, run)
    if elsewhere is None or not record.cache_key:
        return elsewhere
    return f"{elsewhere} (stage cache {record.cache_key[:12]})"


def _grouped(values: dict[str, str]) -> str:
    """'3f2a (every stage)' or '3f2a (baseline, w8); 9c1d (a8)': stages that differ stand out."""
    groups: dict[str, list[str]] = {}
    for stage, value in values.items():
        groups.setdefault(value, []).append(stage)
    if len(groups) == 1 and len(values) > 1:
        return f"{next(iter(groups))} (every stage)"
    return "; ".join(f"{value} ({', '.join(stages)})" for value, stages in groups.items())


def comparability_rows(records: list[StageRecord]) -> list[dict[str, str]]:
    """For the sign-off: the chat template, tokenizer, load profile and per-set settings every
    stage was asked with (gates/comparability.py), grouped by value."""
    asked = {r.name: r.comparability for r in records if r.comparability is not None}
    if not asked:
        return []
    rows = [{"what": label, "value": _grouped({name: getattr(c, field) for name, c in asked.items()})}
            for label, field in (("Chat template", "chat_template"), ("Tokenizer", "tokenizer"),
                                 ("Load profile", "load_profile"))]
    for set_name in sorted({name for c in asked.values() for name in c.sets}):
        shown = {stage: ", ".join([f"{key} {json.dumps(value)}" for key, value in
                                   c.sets[set_name].generation.items()]
                                  + [f"{c.sets[set_name].items} first-look items"])
                 for stage, c in asked.items() if set_name in c.sets}
        rows.append({"what": f"Eval set {set_name}", "value": _grouped(shown)})
    if len(asked) < len(records):
        rows.append({"what": "Not recorded", "value": ", ".join(
            r.name for r in records if r.comparability is None) + " (stored by an older quantgate)"})
    return rows


def load_prompts_line(records: list[StageRecord]) -> str:
    """Which prompts the load sent, per stage that recorded it."""
    sources = {r.name: r.comparability.load_prompts for r in records
               if r.comparability is not None and r.load is not None}
    return _grouped(sources) if sources else ""


def cache_rows(records: list[StageRecord], run: str) -> list[dict[str, str]]:
    """The stage cache key of every stage that has one, and whether this run measured it."""
    return [{"stage": r.name, "key": r.cache_key,
             "origin": measured_elsewhere(r, run) or "measured in this run"}
            for r in records if r.cache_key]


def set_sizes(verdict: Verdict, records: list[StageRecord]) -> list[dict[str, Any]]:
    """Per stage: the pooled accuracy test, its power at the sizes it ran, and what the adaptive
    sample size added."""
    by_name = {r.name: r for r in records}
    rows = []
    for stage in verdict.stages:
        check = next((c for c in stage.checks if c.rule == "quality.accuracy"), None)
        if check is None or "ci_low" not in check.details:
            continue
        d = check.details
        quality = by_name[stage.stage].quality if stage.stage in by_name else None
        added = ", ".join(f"{n} +{k}" for n, k in (quality.added_items if quality else {}).items())
        rows.append({
            "stage": stage.stage, "n": d["n"], "sets": d["sets"],
            "interval": f"{100 * float(d['difference']):+.1f} [{100 * float(d['ci_low']):+.1f}, "
                        f"{100 * float(d['ci_high']):+.1f}]",
            "margin": f"-{100 * float(d['margin']):.0f}", "power": f"{float(d['power']):.0%}",
            "looks": quality.looks if quality else 1, "added": added or "-",
            "status": check.status,
        })
    return rows


def _context(verdict: Verdict, records: list[StageRecord], signer: str | None,
             images: dict[str, Path], run: str, whatif: Any,
             prompts: Callable[[str], dict[str, str]] = _prompts) -> dict[str, Any]:
    set_names = sorted({name for r in records if r.quality for name in r.quality.tasks})
    policy = GatePolicy.model_validate(verdict.policy) if verdict.policy else GatePolicy()
    by_name = {r.name: r for r in records}
    changed = {s.stage: "-" for s in verdict.stages}
    for r in records:
        parent = by_name.get(r.parent or "")
        changed[r.name] = ", ".join(
            f"{axis}: {parent.axes.get(axis)} → {value}" for axis, value in r.axes.items()
            if parent and parent.axes.get(axis) != value) or ("-" if parent else "baseline")
        if r.kind == "weights_activations":  # declared on purpose: online W8A8 moves both
            changed[r.name] += " (two axes at once, declared: effects not separated)"
    return {
        "verdict": verdict, "set_names": set_names, "policy": policy,
        "headline": [_headline(s, set_names) for s in verdict.stages if s.parent is not None],
        "columns": rules.columns(),
        "changed": changed, "flips": flipped_items(records, prompts),
        "engine": engine_rows(records),
        "kernel_changes": kernel_changes(records),
        "sizes": set_sizes(verdict, records), "images": images, "load": load_rows(records),
        "cores": core_lines(records), "reused": {r.name: reused_from(r, run) for r in records},
        "cache": cache_rows(records, run), "comparability": comparability_rows(records),
        "load_prompts": load_prompts_line(records), "whatif": whatif, "timing": timing_rows(records, run),
        "signer": signer, "signed_at": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "policy_hash": hashlib.sha256(json.dumps(verdict.policy, sort_keys=True).encode())
        .hexdigest()[:16],
        "status_colors": plots.STATUS_COLORS, "methods": methods(policy),
        "recovery": recovery.section(records, policy), "emulated_note": recovery.EMULATED_NOTE,
        "context_curves": curve_tables(records),
    }


def repair_line(judged: RepairVerdict, full: bool = True) -> str:
    """A repair stage's verdict beside the failed stage's, with what shipping it would cost: its
    reasons in full, or (`full` False, the sign-off block) the rules that failed."""
    cost = ""
    if judged.weight_bytes and judged.failed_weight_bytes:
        cost = (f", {judged.weight_bytes / 2**20:.1f} MiB of weights "
                f"({judged.weight_bytes / judged.failed_weight_bytes - 1:+.1%} against the failed "
                "candidate: decode reads every weight byte per token)")
    if judged.kv_bytes_per_token and judged.failed_kv_bytes_per_token:
        cost = (f", {judged.kv_bytes_per_token:,} KV-cache bytes a token "
                f"({judged.kv_bytes_per_token / judged.failed_kv_bytes_per_token - 1:+.1%} "
                "against the failed candidate: its KV capacity in tokens "
                f"x{judged.failed_kv_bytes_per_token / judged.kv_bytes_per_token:.2f})")
    tpot = judged.tpot_ms
    if judged.stage in tpot and len(tpot) > 1:
        others = " and ".join(f"{ms:.3g} ms for {name}" for name, ms in tpot.items()
                              if name != judged.stage)
        cost += (f"; predicted one-user TPOT on {judged.predicted_on} (the what-if): "
                 f"{tpot[judged.stage]:.3g} ms against {others}")
    if full:
        why = "; ".join(judged.reasons)
    else:
        why = ", ".join(dict.fromkeys(r.split(": ")[1] for r in judged.reasons if ": " in r))
    return (f"Repair tested as stage {judged.stage}: {judged.configuration}{cost}: "
            f"{judged.decision.upper()}" + (f" ({why})" if why and not full else
                                            f": {why}" if why else "") + ".")


def diagnosis_rows(diagnosis: Diagnosis, repairs: Sequence[RepairVerdict] = ()) -> dict[str, Any]:
    """One failed stage's rollback diagnosis as the templates show it, with its repair's verdict."""
    how = (f"{diagnosis.kl}; {diagnosis.interval}; {diagnosis.sequences} sequences, "
           f"{diagnosis.tokens} tokens forwarded per group, {diagnosis.forwards} groups in "
           f"{diagnosis.seconds:.0f} s on {diagnosis.threads} thread"
           f"{'s' * (diagnosis.threads != 1)}. Reference: {diagnosis.reference}.")
    return {"stage": diagnosis.stage, "parent": diagnosis.parent,
            "failed": ", ".join(diagnosis.failed_rules) or "-",
            "emulated": ", ".join(f"{a}={v}" for a, v in diagnosis.emulated.items()) or "-",
            "how": how, "lines": summary(diagnosis) + [
                repair_line(r) for r in repairs if r.repairs == diagnosis.stage]}


def _environment(autoescape: bool):
    import jinja2

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=autoescape,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["md"] = lambda text: " ".join(str(text).split()).replace("|", "\\|")
    env.filters["pct"] = lambda x: f"{float(x):.0%}"
    return env


def write_report(
    verdict: Verdict, records: list[StageRecord], out_dir: Path, signer: str | None = None,
    run: str | None = None, workload: Workload | None = None, workload_source: str = "",
    whatif_gpus: Sequence[str] = DEFAULT_GPUS, placement: Placement | None = None,
    prompts: Callable[[str], dict[str, str]] | None = None,
    diagnoses: dict[str, Diagnosis] | None = None,
) -> dict[str, Path]:
    """Writes report.html (self-contained), report.md, model_card.md (the candidate's recovery
    table, when it has quality results) and the figures (PNG) into out_dir.

    `run`: the results folder name of the run reported on (default: out_dir's name, as the flow
    names the two alike); a stage measured in another run came from the stage cache.
    `workload` (`gates.whatif.workload_from_profile(profile)`) and `workload_source`: the run's
    load profile for the capacity what-if; without it the what-if predicts the reference
    workload and says so (the records do not keep request sizes). `whatif_gpus`: its targets.
    `placement`: where the run's CUDA engines went (None off CUDA): stated as its lines, and the
    GPU its stages served on is what the what-if is checked against (else this machine's CPU).
    `prompts(set)`: the prompt texts by item id the flips show (a re-gate: those the run kept,
    gates.run_inputs); default: the sets' data as they are now. `diagnoses`: failed stages'
    diagnosis.json by stage (gates.diagnosis.read_diagnoses): the rollback section and its chart,
    left out when there are none.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    policy = GatePolicy.model_validate(verdict.policy) if verdict.policy else GatePolicy()
    drawn = {
        "forest": plots.forest(verdict, out_dir / "forest.png"),
        "long_context": plots.long_context(records, out_dir / "long_context.png"),
        "latency_cdf": plots.latency_cdfs(records, out_dir / "latency_cdf.png"),
        "length_ratios": plots.length_histogram(records, policy.length.max_change,
                                                out_dir / "length_ratios.png"),
        "sensitivity": plots.sensitivity(list((diagnoses or {}).values()),
                                         out_dir / "sensitivity.png"),
    }
    images = {name: path for name, path in drawn.items() if path is not None}
    whatif = whatif_section(records, workload, workload_source, whatif_gpus,
                            measured_on=placement.served_on() if placement else None)
    context = _context(verdict, records, signer, images, run or out_dir.name, whatif,
                       prompts or _prompts)
    context["placement"] = placement.describe() if placement else []
    context["diagnoses"] = [diagnosis_rows(d, verdict.repairs) for d in (diagnoses or {}).values()]
    context["repairs"] = [{"repairs": r.repairs, "line": repair_line(r, full=False)}
                          for r in verdict.repairs]
    inline = {name: "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode()
              for name, path in images.items()}
    html = _environment(True).get_template("report.html.j2").render(context | {"src": inline})
    md = _environment(False).get_template("report.md.j2").render(
        context | {"src": {name: path.name for name, path in images.items()}})
    paths = {"html": out_dir / "report.html", "md": out_dir / "report.md"}
    paths["html"].write_text(html)
    paths["md"].write_text(md)
    card = recovery.model_card(records, policy, verdict.candidate)
    if card is not None:
        paths["model_card"] = out_dir / "model_card.md"
        paths["model_card"].write_text(card)
    return paths | images
