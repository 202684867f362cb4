"""Synthetic stage records for gate tests: scores, lengths and latencies we control."""

from __future__ import annotations

from evalsets.results import QualityItem, QualityResult, TaskQuality
from gates.record import StageRecord
from infra.engine import EngineFacts
from load.results import LoadResult, LoadSummary


def summary(level: str, tpot: float = 25.0, ttft: float = 80.0, errors: int = 0) -> LoadSummary:
    return LoadSummary(
        level=level, users=1 if level == "low" else 8, requests=100, errors=errors,
        error_rate=errors / 100, duration_s=30, requests_per_s=3.3, output_tokens_per_s=200,
        ttft_p50_ms=ttft, tpot_p50_ms=tpot,
    )


def record(
    name: str,
    parent: str | None,
    scores: list[float],
    lengths: list[int] | None = None,
    perplexity: float = 10.0,
    tpot: float = 25.0,
    errors: int = 0,
    kind: str = "weights",
) -> StageRecord:
    lengths = lengths or [40] * len(scores)
    items = [
        QualityItem(id=str(i), prompt_hash="h", response="r", score=s, output_tokens=n)
        for i, (s, n) in enumerate(zip(scores, lengths, strict=True))
    ]
    quality = QualityResult(
        tasks={"math": TaskQuality(task="math", metric="accuracy", value=sum(scores) / len(scores),
                                   items=items)},
        perplexity=perplexity,
    )
    load = LoadResult(summaries={lvl: summary(lvl, tpot, errors=errors) for lvl in ("low", "high")})
    facts = EngineFacts(base_url="http://x", model=name, command=["vllm", "--model", name])
    return StageRecord(
        name=name, kind="baseline" if parent is None else kind, parent=parent,
        axes={"weights": "none", "activations": "none", "kv_cache": "auto"},
        facts=facts, quality=quality, load=load,
    )
