from evalsets.results import Divergence, PerplexityRatio
from gates.formats import format_rows, orderings, with_capacity
from tests.gates.records import chain


def formats(kls: dict[str, float]):
    base, stage = chain()[:2]
    records = [base]
    for name, kl in kls.items():
        record = stage.model_copy(deep=True, update={"name": name, "parent": base.name})
        record.quality.divergence = Divergence(tokens=100, mean_kl=kl, top1_agreement=1 - kl)
        record.quality.perplexity_vs_baseline = PerplexityRatio(tokens=100, ratio=1 + kl)
        records.append(record)
    return records


def test_rows_hold_divergence_and_accuracy_per_set():
    table = format_rows(formats({"nvfp4": 0.05, "mxfp4": 0.08}))
    nvfp4 = table.set_index("stage").loc["nvfp4"]
    assert nvfp4["kl"] == 0.05 and nvfp4["ppl_ratio"] == 1.05 and nvfp4["top1"] == 0.95
    assert "acc.math" in table and table.set_index("stage").loc["baseline", "ppl_ratio"] == 1.0


def test_orderings_are_judged_and_missing_ones_said():
    table = format_rows(formats({"fp8-block": 0.01, "fp8-channel": 0.02, "fp8-tensor": 0.015,
                                 "nvfp4": 0.05, "mxfp4": 0.08}))
    fp8 = next(o for o in orderings(table) if o["claim"].startswith("FP8"))
    fp4 = next(o for o in orderings(table) if o["claim"].startswith("FP4"))
    assert fp8["holds"] is False and "fp8-channel 0.0200" in fp8["note"]
    assert fp4["holds"] is True
    int4 = [o for o in orderings(table) if o["claim"].startswith("INT4")]
    assert all(o["holds"] is None and o["note"].startswith("not measured") for o in int4)


def test_capacity_columns_come_from_the_prediction():
    import pandas as pd

    records = formats({"nvfp4": 0.05})
    for record in records:
        record.shape = {"hidden_size": 8}

    def predict(shape, axes, gpus):
        return pd.DataFrame([{"stage": s, "gpu": g, "capacity_rps": 10.0 * (i + 1)}
                             for i, s in enumerate(axes) for g in gpus])

    table = with_capacity(format_rows(records), records, ["h100-sxm"], predict)
    assert list(table["capacity.h100-sxm (predicted)"]) == [10.0, 20.0]
