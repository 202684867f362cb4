"""The format comparison: per weight format, how far it moved the model, and the public ordering.

From the stage records of one run whose stages each change the weights of the same baseline
(flows/specs/formats.yaml): perplexity ratio, KL and top-1 agreement against the baseline, the
accuracy of each eval set, and (optionally) the capacity the what-if predicts on target GPUs.
Then the orderings published for these formats, each said to hold or not on this model:
block-wise FP8 <= per-channel <= per-tensor error; NVFP4 < MXFP4; INT4 group 32 vs 128.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pandas as pd

from gates.record import StageRecord

# (what is claimed, the stages in the claimed order of error, smallest first)
ORDERINGS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("FP8: block-wise <= per-channel <= per-tensor", ("fp8-block", "fp8-channel", "fp8-tensor")),
    ("FP4: NVFP4 (group 16, FP8 scales) < MXFP4 (group 32, E8M0 scales)", ("nvfp4", "mxfp4")),
    ("INT4 RTN: group 32 < group 128", ("int4-g32-rtn", "int4-g128-rtn")),
    ("INT4 GPTQ: group 32 < group 128", ("int4-g32-gptq", "int4-g128-gptq")),
    ("INT4 group 32: GPTQ < RTN", ("int4-g32-gptq", "int4-g32-rtn")),
)


def format_rows(records: Sequence[StageRecord]) -> pd.DataFrame:
    """One row per stage measured against the baseline: its divergence and accuracies."""
    baseline = next(record for record in records if record.parent is None)
    rows = []
    for record in records:
        quality = record.quality
        row = {"stage": record.name, "weights": record.axes.get("weights"),
               "emulated": record.emulated, "error": record.error}
        if quality is not None:
            ratio = quality.perplexity_vs_baseline
            row |= {"ppl_ratio": ratio.ratio if ratio else (1.0 if record is baseline else None),
                    "kl": quality.divergence.mean_kl if quality.divergence else None,
                    "top1": quality.divergence.top1_agreement if quality.divergence else None}
            row |= {f"acc.{name}": task.value for name, task in quality.tasks.items()}
        rows.append(row)
    return pd.DataFrame(rows)


def orderings(table: pd.DataFrame, error: str = "kl") -> list[dict]:
    """Each published ordering, judged on `error` (KL to the baseline by default)."""
    by_stage = table.set_index("stage")[error].to_dict() if error in table else {}
    out = []
    for claim, stages in ORDERINGS:
        values = [by_stage.get(stage) for stage in stages]
        if any(value is None or pd.isna(value) for value in values):
            out.append({"claim": claim, "holds": None, "values": values,
                        "note": "not measured: " + ", ".join(
                            s for s, v in zip(stages, values, strict=True)
                            if v is None or pd.isna(v))})
            continue
        holds = all(a <= b for a, b in zip(values, values[1:], strict=False))
        out.append({"claim": claim, "holds": holds, "values": values,
                    "note": " vs ".join(f"{s} {v:.4f}" for s, v in zip(stages, values, strict=True))})
    return out


def with_capacity(table: pd.DataFrame, records: Sequence[StageRecord], gpus: Sequence[str],
                  predict: Callable[[dict, dict, Sequence[str]], pd.DataFrame]) -> pd.DataFrame:
    """The table with a predicted-capacity column per GPU (`predict(shape, axes_by_stage, gpus)`
    returns whatif_table's frame); stages without a model shape stay empty."""
    shaped = [record for record in records if record.shape]
    if not shaped:
        return table
    predicted = predict(shaped[0].shape, {r.name: r.axes for r in shaped}, gpus)
    for gpu in gpus:
        rates = predicted[predicted["gpu"] == gpu].set_index("stage")["capacity_rps"]
        table[f"capacity.{gpu} (predicted)"] = table["stage"].map(rates)
    return table
