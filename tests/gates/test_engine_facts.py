"""The report's engine facts: loaded weights and kernels per stage, and the kernel change the
sign-off names (a stage that fell back to a slow kernel does not keep a silent label)."""

from __future__ import annotations

from gates.engine_facts import engine_rows, kernel_changes
from gates.record import StageRecord
from infra.engine import EngineFacts

AXES = {"weights": "none", "activations": "none", "kv_cache": "auto"}
FP8 = {"weights": "float8/tensor", "activations": "float8/token/dynamic", "kv_cache": "auto"}


def record(name: str, parent: str | None, axes: dict, **facts) -> StageRecord:
    return StageRecord(name=name, kind="baseline" if parent is None else "weights_activations",
                       parent=parent, axes=axes,
                       facts=EngineFacts(base_url="http://x", model="m", **facts))


def test_a_kernel_change_and_the_fp8_marlin_fallback_are_named_for_the_sign_off():
    base = record("baseline", None, AXES, attention_backend="FLASH_ATTN",
                  weight_memory_bytes=16 * 10**9, weight_bytes=16 * 10**9)
    fp8 = record("fp8", "baseline", FP8, attention_backend="FLASH_ATTN", quantization="fp8",
                 linear_kernels=["MarlinFP8ScaledMMLinearKernel for Fp8LinearMethod"],
                 fp8_marlin_fallback=True, weight_memory_bytes=8 * 10**9, weight_bytes=16 * 10**9)
    changes = kernel_changes([base, fp8])
    assert [c["stage"] for c in changes] == ["fp8"]
    assert "FP8-Marlin fallback: weight-only, activations not quantized" in changes[0]["change"]
    assert changes[0]["change"].startswith("linear -; attention FLASH_ATTN → fp8: linear Marlin")
    rows = engine_rows([base, fp8])
    assert rows[1]["loaded"] == "8,000.0 MB 0.50x baseline"
    assert rows[1]["weights"] == "16,000.0 MB 1.00x baseline"  # online: the bf16 files on disk


def test_the_same_kernels_or_none_logged_name_no_change():
    base = record("baseline", None, AXES, attention_backend="FLASH_ATTN")
    same = record("kv", "baseline", AXES, attention_backend="FLASH_ATTN")
    silent = record("cpu", "baseline", AXES)
    assert kernel_changes([base, same, silent]) == []


def test_the_report_shows_kernels_per_stage_and_names_the_change_in_the_sign_off(tmp_path):
    from gates.decide import decide
    from gates.policy import GatePolicy
    from gates.report import write_report
    from tests.gates.records import chain

    records = chain()
    for record in records:
        record.facts = record.facts.model_copy(update={"attention_backend": "FLASH_ATTN"})
    records[-1].facts = records[-1].facts.model_copy(update={
        "linear_kernels": ["MarlinFP8ScaledMMLinearKernel for Fp8LinearMethod"],
        "fp8_marlin_fallback": True})
    verdict = decide("demo", records, GatePolicy())
    paths = write_report(verdict, records, tmp_path, signer=None)
    md, html = paths["md"].read_text(), paths["html"].read_text()
    assert "| linear -; attention FLASH_ATTN |" in md
    assert f"| Kernel change, {records[-1].name} | linear -; attention FLASH_ATTN → linear " \
           "MarlinFP8ScaledMMLinearKernel (FP8-Marlin fallback" in md
    assert 'id="kernel-changes"' in html


def test_the_report_states_the_placement_it_is_given(tmp_path):
    from gates.decide import decide
    from gates.policy import GatePolicy
    from gates.report import write_report
    from infra.placement import EngineNeed, declared_gpus, plan_placement
    from tests.gates.records import chain

    records = chain()
    verdict = decide("demo", records, GatePolicy())
    placement = plan_placement(declared_gpus(80, 1, name="NVIDIA H100 80GB HBM3"), [
        EngineNeed("stage", name, 270_000_000, 46_080, 5120) for name in ("baseline", "a8")
    ] + [EngineNeed("beside", "baseline", 270_000_000, 46_080, 5120)])
    lines = placement.describe()
    assert lines[0] == "1 GPU(s), NVIDIA H100 80GB HBM3 80 GiB; tensor_parallel_size 1"
    assert lines[1].startswith("stage engines (baseline, a8): CUDA_VISIBLE_DEVICES=0, "
                               "gpu_memory_utilization 0.47")
    paths = write_report(verdict, records, tmp_path, placement=placement)
    assert f"Placement: {lines[0]}; {lines[1]}" in paths["md"].read_text()
    assert 'id="placement"' in paths["html"].read_text()
    bare = write_report(verdict, records, tmp_path / "cpu")
    assert "Placement:" not in bare["md"].read_text()
