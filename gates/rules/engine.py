"""What the stage bought: engine facts and throughput against the parent and the baseline (shown,
never gated)."""

from __future__ import annotations

from gates.record import StageRecord
from gates.rules import Column, Context, Rule, find, register
from gates.verdict import Check, StageVerdict


def _ratio(now: float | None, before: float | None) -> float | None:
    return now / before if now and before else None


def bought(stage: StageRecord, parent: StageRecord, baseline: StageRecord) -> dict[str, float | None]:
    """Engine facts and throughput as ratios to the parent and the baseline."""
    out: dict[str, float | None] = {}
    for name, ref in (("parent", parent), ("baseline", baseline)):
        for fact in ("weight_bytes", "kv_cache_tokens"):
            out[f"{fact}_vs_{name}"] = _ratio(
                getattr(stage.facts, fact, None) if stage.facts else None,
                getattr(ref.facts, fact, None) if ref.facts else None)
    for level in ("low", "high"):
        mine = stage.load.summaries.get(level) if stage.load else None
        theirs = parent.load.summaries.get(level) if parent.load else None
        for figure in ("output_tokens_per_s", "tpot_p50_ms", "ttft_p50_ms"):
            out[f"{level}.{figure}_vs_parent"] = _ratio(getattr(mine, figure, None),
                                                        getattr(theirs, figure, None))
    return out


def _shown(x: float | None) -> str:
    return f"x{float(x):.2f}" if x is not None else "-"


class Engine(Rule):
    name = "engine"
    order = 200
    columns = (Column("bought", "bought", 90, gated=False),)

    def checks(self, context: Context) -> list[Check]:
        stage = context.stage
        gains = bought(stage, context.parent, context.baseline)
        shown = [f"{key.replace('_vs_', ' vs ')} x{value:.2f}" for key, value in gains.items()
                 if value is not None and not key.startswith("low.") and "ttft" not in key]
        note = " (emulated: speed not representative)" if stage.emulated else ""
        return [Check(rule="engine", passed=True, applicable=False, details=gains,
                      reason=("; ".join(shown) or "no engine facts recorded") + note)]

    def cells(self, stage: StageVerdict, set_names: list[str]) -> dict[str, dict[str, str]]:
        engine = find(stage, "engine")
        gains = engine.details if engine else {}
        text = ", ".join([f"weights {_shown(gains.get('weight_bytes_vs_baseline'))}",
                          f"KV tokens {_shown(gains.get('kv_cache_tokens_vs_baseline'))}",
                          "tokens/s at high load "
                          f"{_shown(gains.get('high.output_tokens_per_s_vs_parent'))}"]) \
            if engine else "-"
        return {"bought": {"text": text, "status": "n/a"}}


register(Engine())
