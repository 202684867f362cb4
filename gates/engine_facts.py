"""The report's engine facts: per stage what the engine held and ran (weights, KV cache, the
kernels it picked), and the kernel changes between a stage and its parent for the sign-off."""

from __future__ import annotations

from gates.record import StageRecord


def _mb(value: int | None) -> str:
    return f"{value / 1e6:,.1f} MB" if value else "-"


def engine_rows(records: list[StageRecord]) -> list[dict[str, str]]:
    base = records[0].facts if records and records[0].facts else None
    rows = []
    for record in records:
        f = record.facts
        if f is None:
            rows.append({"stage": record.name, "weights": "-", "loaded": "-", "kv": "-",
                         "kv_dtype": "-", "kernels": "-", "startup": "-", "version": "-",
                         "command": "(engine never came up)"})
            continue
        vs = {k: (f"{getattr(f, k) / getattr(base, k):.2f}x baseline"
                  if base and getattr(base, k) and getattr(f, k) else "") for k in
              ("weight_bytes", "kv_cache_tokens", "weight_memory_bytes")}
        rows.append({
            "stage": record.name + (" (emulated)" if record.emulated else ""),
            "weights": f"{_mb(f.weight_bytes)} {vs['weight_bytes']}".strip(),
            "loaded": f"{_mb(f.weight_memory_bytes)} {vs['weight_memory_bytes']}".strip(),
            "kv": f"{f.kv_cache_tokens:,} {vs['kv_cache_tokens']}".strip() if f.kv_cache_tokens
            else "-",
            "kv_dtype": str(f.kv_cache_dtype or record.axes.get("kv_cache", "-"))
            + (" (default scales 1.0)" if f.kv_default_scales else ""),
            "kernels": f.kernels() or "-",
            "startup": f"{f.startup_s:.0f} s" if f.startup_s else "-",
            "version": str(f.version or "-"), "command": f.command_line(),
        })
    return rows


def kernel_changes(records: list[StageRecord]) -> list[dict[str, str]]:
    """Each stage whose engine ran other kernels than its parent's (a new linear kernel, another
    attention backend, the FP8-Marlin fallback), as {stage, change}; a slow fallback the label
    does not show is named where the sign-off reads it."""
    by_name = {record.name: record for record in records}
    changes = []
    for record in records:
        parent = by_name.get(record.parent or "")
        if record.facts is None or parent is None or parent.facts is None:
            continue
        mine, theirs = record.facts.kernels(), parent.facts.kernels()
        if mine and mine != theirs:
            changes.append({"stage": record.name,
                            "change": f"{theirs or 'not logged'} → {mine} (vs {parent.name})"})
    return changes
