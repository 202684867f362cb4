"""The report's rollback section and sensitivity chart: shown from diagnosis.json, absent without it."""

from __future__ import annotations

import pytest

from gates.decide import decide
from gates.diagnosis import Diagnosis, GroupCost, KvHeadOffsets, read_diagnoses, summary
from gates.policy import GatePolicy
from gates.report import write_report
from tests.gates.records import chain


def diagnosis(stage: str = "a8") -> Diagnosis:
    costs = [GroupCost(name="all", sweep="all", mean_kl=0.30, ci_low=0.25, ci_high=0.36)]
    costs += [GroupCost(name=f"layers {i}", sweep="layer", mean_kl=kl, ci_low=kl * 0.8,
                        ci_high=kl * 1.2) for i, kl in enumerate((0.20, 0.01, 0.012, 0.011))]
    costs += [GroupCost(name=kind, sweep="module", mean_kl=kl, ci_low=kl * 0.8, ci_high=kl * 1.2)
              for kind, kl in (("q_proj", 0.01), ("down_proj", 0.15))]
    costs += [GroupCost(name=f"layers 0 {kind}", sweep="layer_module", mean_kl=kl, ci_low=kl * 0.8,
                        ci_high=kl * 1.2) for kind, kl in (("q_proj", 0.01), ("down_proj", 0.12))]
    costs += [GroupCost(name="K all layers", sweep="kv", mean_kl=0.05, ci_low=0.04, ci_high=0.06),
              GroupCost(name="V all layers", sweep="kv", mean_kl=0.002, ci_low=0.001,
                        ci_high=0.003)]
    costs += [GroupCost(name=f"{t} layer {i}", sweep="kv_layer", mean_kl=kl, ci_low=kl, ci_high=kl)
              for i in range(4) for t, kl in (("K", 0.01 * (4 - i)), ("V", 0.001))]
    costs += [GroupCost(name=f"K layer 0 head {h}", sweep="kv_head", mean_kl=kl, ci_low=kl,
                        ci_high=kl) for h, kl in ((0, 0.002), (1, 0.03))]
    offsets = [KvHeadOffsets(layer=layer, head=head, k_bias_share=0.6 if layer < 3 else 0.0,
                             v_bias_share=0.0, k_offset_energy=0.9, v_offset_energy=0.1)
               for layer in range(4) for head in range(2)]
    return Diagnosis(stage=stage, parent="w8", failed_rules=["divergence.kl"],
                     checkpoint="/models/bf16", reference="the parent", emulated={
                         "activations": "int8/token/dynamic"}, costs=costs, kv_offsets=offsets,
                     interval="95% CI", sequences=3, tokens=900, scored_tokens=800, seconds=61.0,
                     forwards=len(costs))


def test_summary_names_the_costly_layers_kinds_and_the_biased_k():
    lines = summary(diagnosis())
    text = "\n".join(lines)
    assert "layers 0 0.2000 [0.1600, 0.2400]" in text
    assert "stands out" in text and "layers 0:" in text
    assert text.index("down_proj") < text.index("q_proj")
    assert "Within layers 0, per module kind: down_proj 0.1200" in text
    assert "K carries the loss" in text
    assert "K in layers 0–2 carries a constant bias" in text
    assert "V: no layer" in text
    assert "Per KV head in the costliest layers: K layer 0 head 1 0.0300" in text
    assert "Constant offsets carry 90% of K's mean square" in text


def test_report_shows_the_rollback_section_and_chart_when_a_diagnosis_is_stored(tmp_path):
    records = chain()
    (tmp_path / "run" / "a8").mkdir(parents=True)
    diagnosis().save(tmp_path / "run" / "a8")
    found = read_diagnoses(tmp_path / "run", [r.name for r in records])
    assert list(found) == ["a8"]
    verdict = decide("demo", records, GatePolicy())
    paths = write_report(verdict, records, tmp_path / "report", diagnoses=found)
    assert paths["sensitivity"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    html, md = paths["html"].read_text(), paths["md"].read_text()
    assert 'id="diagnosis"' in html and 'id="sensitivity"' in html
    assert "K in layers 0–2 carries a constant bias" in html
    assert "## Rollback diagnosis" in md and "![sensitivity](sensitivity.png)" in md
    assert "61 s on 1 thread" in md


def test_report_leaves_the_section_out_without_a_diagnosis(tmp_path):
    records = chain()
    assert read_diagnoses(tmp_path, [r.name for r in records]) == {}
    verdict = decide("demo", records, GatePolicy())
    paths = write_report(verdict, records, tmp_path / "report")
    assert "sensitivity" not in paths and not (tmp_path / "report" / "sensitivity.png").exists()
    assert 'id="diagnosis"' not in paths["html"].read_text()
    assert "Rollback diagnosis" not in paths["md"].read_text()


def test_a_damaged_diagnosis_is_refused_with_its_path(tmp_path):
    from infra.stored import StoredRecordError

    (tmp_path / "a8").mkdir()
    (tmp_path / "a8" / "diagnosis.json").write_text('{"stage": 3}')
    with pytest.raises(StoredRecordError, match="diagnosis.json"):
        read_diagnoses(tmp_path, ["a8"])


def test_report_shows_the_repair_tried_its_verdict_and_what_it_costs(tmp_path):
    from gates.repair import RepairOption
    from gates.verdict import RepairVerdict

    records = chain()
    found = diagnosis()
    found.repair_target, found.repair_target_why = 0.0488, "the perplexity limit, read as KL"
    found.weight_bytes = 100 * 2**20
    found.repairs = [RepairOption(weights="int4/group32", kept_layers=[0], bytes=120 * 2**20,
                                  mean_kl=0.09, ci_low=0.08, ci_high=0.10, target=0.0488),
                     RepairOption(weights="int8/channel", bytes=150 * 2**20, mean_kl=0.004,
                                  ci_low=0.003, ci_high=0.005, target=0.0488)]
    found.repair, found.repair_stage = found.repairs[1], "a8-repair"
    verdict = decide("demo", records, GatePolicy())
    verdict.repairs = [RepairVerdict(stage="a8-repair", repairs="a8", configuration="int8/channel",
                                     decision="go", weight_bytes=150 * 2**20,
                                     failed_weight_bytes=100 * 2**20, predicted_on="h100-sxm",
                                     tpot_ms={"a8-repair": 0.5, "a8": 0.4, "baseline": 0.8})]
    paths = write_report(verdict, records, tmp_path / "report", diagnoses={"a8": found})
    html, md = paths["html"].read_text(), paths["md"].read_text()
    line = ("Repair tested as stage a8-repair: int8/channel, 150.0 MiB of weights (+50.0% against "
            "the failed candidate: decode reads every weight byte per token); predicted one-user "
            "TPOT on h100-sxm (the what-if): 0.5 ms against 0.4 ms for a8 and 0.8 ms for "
            "baseline: GO.")
    assert line in md and line in html
    assert '<td class="repair">' in html and "| Repair of a8 |" in md  # in the sign-off block
    assert "Repair chosen: int8/channel (150.0 MiB of weights against 100.0 MiB)" in md
    assert "int4/group32, layers 0 as bf16: KL 0.0900 [0.0800, 0.1000], +20.0% bytes" in md


def test_report_shows_a_kv_repair_in_kv_bytes_per_token_with_its_chart(tmp_path):
    """A KV stage's repair (costliest layers' cache in the model dtype) is priced per token of
    cache, not in weight MiB, in the sentences, the sign-off line and the chart; its stored
    diagnosis reads back as a KV option."""
    from gates.repair import KvRepairOption
    from gates.verdict import RepairVerdict

    records = chain()
    found = diagnosis("kv")
    found.costs = [cost for cost in found.costs if cost.sweep in ("kv", "kv_layer", "kv_head")]
    found.costs.append(GroupCost(name="K and V all layers", sweep="kv_all", mean_kl=0.052,
                                 ci_low=0.045, ci_high=0.06))
    found.repair_target, found.repair_target_why = 0.0122, "the perplexity limit, read as KL"
    found.kv_bytes_per_token = 8 * 256
    found.repairs = [KvRepairOption(kv_cache="fp8_e4m3", skip_layers=skip,
                                    bytes=256 * (8 + len(skip)), mean_kl=kl, ci_low=kl * 0.9,
                                    ci_high=kl * 1.1, target=0.0122)
                     for skip, kl in (([0], 0.03), ([0, 1], 0.011), ([0, 1, 2], 0.004))]
    found.repair, found.repair_stage = found.repairs[1], "kv-repair"
    found.save(tmp_path)
    assert read_diagnoses(tmp_path.parent, [tmp_path.name])[tmp_path.name].repair == found.repair
    verdict = decide("demo", records, GatePolicy())
    verdict.repairs = [RepairVerdict(stage="kv-repair", repairs="kv", decision="go",
                                     configuration=found.repair.name,
                                     kv_bytes_per_token=2560, failed_kv_bytes_per_token=2048)]
    paths = write_report(verdict, records, tmp_path / "report", diagnoses={"kv": found})
    md = paths["md"].read_text()
    assert ("Repair tested as stage kv-repair: fp8_e4m3 KV cache, model dtype on layers 0, 1, "
            "2,560 KV-cache bytes a token (+25.0% against the failed candidate: its KV capacity "
            "in tokens x0.80): GO.") in md
    assert ("Repair chosen: fp8_e4m3 KV cache, model dtype on layers 0, 1 (2,560 KV bytes a "
            "token against 2,048; served with --kv-cache-dtype-skip-layers 0 1)") in md
    assert "The whole KV cache quantized (K and V, every layer): KL 0.0520" in md
    assert "layers 0: KL 0.0300 [0.0270, 0.0330], +12.5% KV bytes" in md
    assert paths["sensitivity"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_served_added_reads_the_named_spans_less_the_parent_s_kl_and_refuses_a_mismatch():
    import numpy as np

    from evalsets.results import PairedTokens
    from gates.diagnosis import served_added
    from infra.errors import MeasurementError
    from tests.gates.records import record

    def tokens(per_span: dict[str, tuple[int, float]]) -> PairedTokens:
        values = np.concatenate([np.full(n, kl) for n, kl in per_span.values()])
        return PairedTokens.from_values(20, [(name, n) for name, (n, _) in per_span.items()],
                                        kl=values, top1_agree=np.ones(values.size),
                                        nll_diff_vs_baseline=np.zeros(values.size))

    base, parent, stage = (record("baseline", None, [1.0]), record("a8", "baseline", [1.0]),
                           record("kv", "a8", [1.0]))
    parent.quality.paired_tokens = tokens({"a": (2, 0.1), "b": (3, 0.2), "c": (5, 0.3)})
    stage.quality.paired_tokens = tokens({"a": (2, 0.5), "b": (3, 0.2), "c": (5, 0.4)})
    top_k, values, whole, count = served_added(stage, parent, ["c", "a"], [5, 2])
    assert top_k == 20 and count == 10
    assert values.tolist() == pytest.approx([0.1] * 5 + [0.4] * 2)
    assert whole == pytest.approx((2 * 0.4 + 5 * 0.1) / 10)
    over_baseline = served_added(stage, base, ["b"], [3])[1]
    assert over_baseline.tolist() == pytest.approx([0.2] * 3)
    for spans, counts, says in ((["d"], [1], "scored span 'd' not at all"),
                                (["a"], [3], "over 2 positions, not 3")):
        with pytest.raises(MeasurementError, match=says):
            served_added(stage, parent, spans, counts)
    parent.quality.paired_tokens = tokens({"a": (2, 0.1), "b": (8, 0.2)})
    with pytest.raises(MeasurementError, match="parent a8 stored no per-token KL on the stage's"):
        served_added(stage, parent, ["a"], [2])
