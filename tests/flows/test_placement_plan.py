"""A CUDA run's placement, planned from its spec and stages: every engine's GPUs and share, and
the engine settings (command, environment) each engine is started with."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

import flows.engines
from flows.engines import (
    kv_bytes_per_token,
    kv_tokens_needed,
    placed,
    plan_run_placement,
    run_gpus,
    spec_port_free,
)
from flows.plan import plan
from flows.spec import Spec
from infra.errors import SpecError
from infra.placement import declared_gpus, parse_nvidia_smi
from infra.vllm_engine import build_command
from load.profile import load_profile
from tests.flows.checkpoints import W8A16, make_checkpoint

DEMO_CONFIG = {"num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
               "head_dim": 64, "hidden_size": 576}


def demo_chain(tmp_path: Path, **engine) -> Spec:
    """The demo model's shape: baseline, then an fp8 KV cache stage timed against it."""
    base = make_checkpoint(tmp_path / "bf16")
    config = json.loads((base / "config.json").read_text()) | DEMO_CONFIG
    (base / "config.json").write_text(json.dumps(config))
    return Spec.model_validate({
        "candidate": "c", "baseline": {"checkpoint": str(base)},
        "engine": {"kind": "vllm", "device": "cuda", **engine},
        "stages": [{"name": "kv", "kind": "kv_cache", "engine_flags": {"kv_cache_dtype": "fp8"}}],
        "evalsets": [{"name": "math", "limit": 40}],
    })


def test_the_demo_on_one_gpu_splits_it_and_each_engine_gets_its_gpus_in_its_environment(tmp_path):
    spec = demo_chain(tmp_path)
    stages = plan(spec)
    placement = plan_run_placement(spec, stages, 5120, declared_gpus(80, 1))
    assert placement.shared
    stage_engine = spec_port_free(spec, None, placement)
    beside = placed(spec.engine, placement, beside=True)
    for engine in (stage_engine, beside):
        command, env = build_command(engine, Path("/m"), stages[1].engine_flags)
        assert env["CUDA_VISIBLE_DEVICES"] == "0"
        assert command[command.index("--gpu-memory-utilization") + 1] == "0.47"
    # The spec itself is left as written (its cache key does not move with the host).
    assert spec.engine.gpu_memory_utilization == 0.9


def test_the_host_gpus_win_over_the_declared_ones_where_nvidia_smi_lists_any(tmp_path, monkeypatch):
    """The spec's gpu_memory_gib/gpu_count plan away from the host; on it, the real cards: the
    lent H100 of session 38 (nvidia-smi's line as it printed it) was planned as "GPU 80 GiB"."""
    spec = demo_chain(tmp_path, gpu_memory_gib=80, gpu_count=1)
    h100 = parse_nvidia_smi("0, NVIDIA H100 80GB HBM3, 81559, 0\n1, NVIDIA H100 80GB HBM3, 81559, 512")
    monkeypatch.setattr(flows.engines, "host_gpus", lambda: h100)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert [(g.name, g.memory_bytes) for g in run_gpus(spec.engine)] == [
        ("NVIDIA H100 80GB HBM3", 81559 * 2**20)] * 2
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert [(g.index, g.used_bytes) for g in run_gpus(spec.engine)] == [(1, 512 * 2**20)]
    assert "NVIDIA H100 80GB HBM3" in plan_run_placement(spec, plan(spec), 5120).describe()[0]
    monkeypatch.setattr(flows.engines, "host_gpus", lambda: [])  # validating elsewhere
    assert [(g.index, g.name, g.memory_bytes) for g in run_gpus(spec.engine)] == [
        (1, "GPU", 80 * 2**30)]


def test_the_demo_on_eight_gpus_puts_the_engine_beside_on_its_own(tmp_path):
    spec = demo_chain(tmp_path, tensor_parallel_size=2)
    placement = plan_run_placement(spec, plan(spec), 5120, declared_gpus(80, 8))
    command, env = build_command(placed(spec.engine, placement, beside=True, stage="baseline"),
                                 Path("/m"), plan(spec)[0].engine_flags)
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert command[command.index("--tensor-parallel-size") + 1] == "2"
    assert command[command.index("--gpu-memory-utilization") + 1] == "0.9"
    # The baseline's engine is kept up beside kv's: its own stage and kv's reference alike.
    roles = {(e["role"], e["stage"]) for e in placement.engines}
    assert roles == {("kept", "baseline"), ("stage", "kv")}


def test_a_cpu_spec_has_no_placement_and_its_engine_is_unchanged(tmp_path):
    spec = demo_chain(tmp_path).model_copy(deep=True)
    spec.engine = spec.engine.model_copy(update={"device": "cpu"})
    assert plan_run_placement(spec, plan(spec), 5120, []) is None
    assert placed(spec.engine, None, beside=True) is spec.engine
    _, env = build_command(spec.engine, Path("/m"), plan(spec)[0].engine_flags)
    assert "CUDA_VISIBLE_DEVICES" not in env


def test_a_spec_whose_engines_cannot_share_the_gpu_is_refused(tmp_path):
    spec = demo_chain(tmp_path, gpu_memory_utilization=0.9)
    with pytest.raises(SpecError, match="set engine.gpu_memory_utilization at most 0.47"):
        plan_run_placement(spec, plan(spec), 5120, declared_gpus(80, 1))


def test_the_users_gpus_are_the_ones_planned_on(tmp_path):
    spec = demo_chain(tmp_path, cuda_visible_devices="4,5", gpu_memory_gib=80)
    placement = plan_run_placement(spec, plan(spec), 5120)
    assert (placement.stage.visible_devices,
            placement.slot(True, "baseline").visible_devices) == ("4", "5")
    assert [g.index for g in placement.gpus] == [4, 5]


def test_cuda_settings_on_a_cpu_engine_and_tp_in_extra_args_are_refused(tmp_path):
    with pytest.raises(ValidationError, match="tensor_parallel_size: CUDA settings on device 'cpu'"):
        Spec.model_validate({"candidate": "c", "baseline": {"checkpoint": str(tmp_path)},
                             "engine": {"device": "cpu", "tensor_parallel_size": 2},
                             "stages": [{"name": "c", "kind": "control"}],
                             "evalsets": [{"name": "math"}]})
    with pytest.raises(ValidationError, match="use engine.tensor_parallel_size"):
        Spec.model_validate({"candidate": "c", "baseline": {"checkpoint": str(tmp_path)},
                             "engine": {"device": "cuda", "extra_args": ["-tp", "2"]},
                             "stages": [{"name": "c", "kind": "control"}],
                             "evalsets": [{"name": "math"}]})


def test_kv_needs_follow_the_profile_and_the_cache_dtype(tmp_path):
    profile = load_profile("demo")
    # demo: 4 users high, a capacity pool of 32, 128 + 32 tokens; max_model_len 4096.
    assert kv_tokens_needed(profile, 4096) == 32 * 160
    assert kv_tokens_needed(profile, 8192) == 8192
    folder = demo_chain(tmp_path).baseline.checkpoint
    assert kv_bytes_per_token(folder, "auto", "bfloat16") == 2 * 30 * 3 * 64 * 2
    assert kv_bytes_per_token(folder, "fp8_e4m3", "bfloat16") == 2 * 30 * 3 * 64


def test_the_plan_recorded_in_the_manifest_reads_back_for_a_later_report(tmp_path):
    from flows.commands.results import _run_placement
    from gates.record import RunManifest

    spec = demo_chain(tmp_path)
    placement = plan_run_placement(spec, plan(spec), 5120, declared_gpus(80, 8))
    RunManifest(candidate="c", stages=[], placement=placement.model_dump()).save(tmp_path / "run")
    assert _run_placement(tmp_path / "run").describe() == placement.describe()
    assert _run_placement(tmp_path / "run").served_on() == placement.gpus[0]
    assert "CUDA_VISIBLE_DEVICES=1" in placement.describe()[2]
    assert _run_placement(tmp_path / "missing") is None


def test_away_from_the_engine_host_an_unknown_gpu_is_left_to_the_worker(tmp_path):
    spec = demo_chain(tmp_path)
    assert plan_run_placement(spec, plan(spec), 5120, [], required=False) is None
    with pytest.raises(SpecError, match="no GPU is known"):
        plan_run_placement(spec, plan(spec), 5120, [])


def test_per_head_kv_scales_are_refused_on_a_gpu_without_flashattention_3_before_any_engine(tmp_path):
    """CUDA vLLM serves a KV scale per attention head only with FlashAttention 3 (Hopper) or 4
    (Blackwell); on an A100 or an L40S no backend is left and the engine dies at start-up. The
    GPUs' compute capability (nvidia-smi's compute_cap) decides before any engine starts; a GPU
    whose capability was not read (validating elsewhere) is left to the engine host's check."""
    scheme = {"num_bits": 8, "type": "float", "strategy": "attn_head", "dynamic": False,
              "symmetric": True}
    folders = {}
    for name, quantization in (("bf16", None), ("w8", W8A16),
                               ("kv", W8A16 | {"kv_cache_scheme": scheme})):
        folders[name] = make_checkpoint(tmp_path / name, quantization)
        config = json.loads((folders[name] / "config.json").read_text()) | DEMO_CONFIG
        (folders[name] / "config.json").write_text(json.dumps(config))
    spec = Spec.model_validate({
        "candidate": "c", "baseline": {"checkpoint": str(folders["bf16"])},
        "engine": {"kind": "vllm", "device": "cuda"},
        "stages": [{"name": "w8", "kind": "weights", "checkpoint": str(folders["w8"])},
                   {"name": "kv", "kind": "kv_cache", "checkpoint": str(folders["kv"]),
                    "engine_flags": {"kv_cache_dtype": "fp8"}}],
        "evalsets": [{"name": "math", "limit": 40}],
    })
    a100, h100 = (parse_nvidia_smi(f"0, {name}, 81920, 0")[0].model_copy(
        update={"compute_capability": cap}) for name, cap in (("NVIDIA A100-SXM4-80GB", "8.0"),
                                                              ("NVIDIA H100 80GB HBM3", "9.0")))
    with pytest.raises(SpecError, match=r"stage 'kv'.*per attention head.*GPU 0 "
                       r"\(NVIDIA A100-SXM4-80GB\) is 8.0"):
        plan_run_placement(spec, plan(spec), 5120, [a100])
    assert plan_run_placement(spec, plan(spec), 5120, [h100]).stage.devices == [0]
    assert plan_run_placement(spec, plan(spec), 5120, declared_gpus(80, 1)) is not None
