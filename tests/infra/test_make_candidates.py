"""Tests for make_candidates.py in llmcompressor's own venv: the resolved schemes, and a real NVFP4
candidate with its dequantized twin, checked bit for bit (~25 s on 2 idle cores)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from safetensors import safe_open

from infra.demo_models import (
    BASELINE_NAME,
    MAKE_CANDIDATES_SCRIPT,
    is_complete,
    llmcompressor_python,
    prepare_candidates,
)
from infra.digest import EMULATED_KEY

REPO = Path(__file__).resolve().parents[2]
SESSION_MODELS = REPO / "models"


def _lc_python() -> Path:
    python = Path(os.environ.get("QG_LLMCOMPRESSOR_PYTHON", REPO / ".venv-llmcompressor/bin/python"))
    return llmcompressor_python(python)  # a CheckpointError with the install hint when missing


def _run_in_lc_venv(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(_lc_python()), "-I", "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        check=False,
        timeout=300,
    )


def test_formats_resolve_to_the_schemes_the_issue_names() -> None:
    result = subprocess.run(
        [str(_lc_python()), "-I", str(MAKE_CANDIDATES_SCRIPT), "--resolve-schemes"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    weights = {name: scheme["weights"] for name, scheme in json.loads(result.stdout).items()}
    nvfp4, mxfp4 = weights["nvfp4"], weights["mxfp4"]
    # NVFP4: E2M1 in groups of 16 with FP8 E4M3 scales; tensor_group adds the per-tensor global scale.
    assert (nvfp4["num_bits"], nvfp4["type"], nvfp4["group_size"]) == (4, "float", 16)
    assert (nvfp4["strategy"], nvfp4["scale_dtype"]) == ("tensor_group", "torch.float8_e4m3fn")
    # MXFP4: groups of 32 with uint8 scales, compressed-tensors' E8M0 (power-of-two exponent) encoding.
    assert (mxfp4["num_bits"], mxfp4["type"], mxfp4["group_size"]) == (4, "float", 32)
    assert (mxfp4["strategy"], mxfp4["scale_dtype"]) == ("group", "torch.uint8")
    assert weights["fp8-block"]["block_structure"] == [128, 128]
    assert weights["int4-g128-gptq"]["group_size"] == 128
    assert all("input_activations" not in s or s["input_activations"] is None
               for s in json.loads(result.stdout).values())  # weight-only: twins can emulate them


def _tensor_meta(checkpoint: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    with safe_open(checkpoint / "model.safetensors", "pt") as tensors:
        return {k: (str(tensors.get_slice(k).get_dtype()), tuple(tensors.get_slice(k).get_shape()))
                for k in tensors.keys()}


def test_nvfp4_is_made_and_its_twin_checked_bit_for_bit(tmp_path: Path) -> None:
    if is_complete(SESSION_MODELS / BASELINE_NAME):  # reuse the session's baseline: no GGUF conversion
        (tmp_path / BASELINE_NAME).symlink_to(SESSION_MODELS / BASELINE_NAME)
    paths = prepare_candidates(tmp_path, ["nvfp4"], python=_lc_python())
    assert [p.name for p in paths] == ["smollm2-135m-nvfp4", "smollm2-135m-nvfp4-dequant"]
    nvfp4, nvfp4_twin = paths

    assert json.loads((nvfp4 / "config.json").read_text())["quantization_config"]["format"] == (
        "nvfp4-pack-quantized"
    )
    meta = _tensor_meta(nvfp4)
    down = "model.layers.0.mlp.down_proj"
    assert meta[f"{down}.weight_packed"] == ("U8", (576, 768))  # two E2M1 values per byte
    assert meta[f"{down}.weight_scale"] == ("F8_E4M3", (576, 96))  # one per 16 inputs
    assert meta[f"{down}.weight_global_scale"] == ("F32", (1,))

    twin_config = json.loads((nvfp4_twin / "config.json").read_text())
    assert "quantization_config" not in twin_config
    emulated = twin_config[EMULATED_KEY]
    assert (emulated["format"], emulated["source"]) == ("nvfp4", "smollm2-135m-nvfp4")
    assert emulated["verified"]["quantized_layers"] == 210  # every decoder Linear layer
    assert all(dtype == "BF16" for dtype, _ in _tensor_meta(nvfp4_twin).values())

    # The same check on a twin with one planted bit must fail and name the layer.
    planted = tmp_path / "planted"
    planted.mkdir()
    code = f"""
import importlib.util, sys
from pathlib import Path
import torch
from safetensors.torch import load_file, save_file
spec = importlib.util.spec_from_file_location("make_candidates", {str(MAKE_CANDIDATES_SCRIPT)!r})
mc = importlib.util.module_from_spec(spec); spec.loader.exec_module(mc)
weights = load_file({str(nvfp4_twin / "model.safetensors")!r})
weights["{down}.weight"].view(torch.int16)[7, 11] ^= 1
save_file(weights, {str(planted / "model.safetensors")!r}, metadata={{"format": "pt"}})
try:
    mc.verify_twin(Path({str(nvfp4)!r}), Path({str(planted)!r}))
except ValueError as error:
    print(error); sys.exit(0)
sys.exit("a planted bit passed the check")
"""
    result = _run_in_lc_venv(code)
    assert result.returncode == 0, result.stdout + result.stderr[-2000:]
    assert f"{down}.weight: 1 of 884736 values differ" in result.stdout
    assert "1 of 210 quantized layers differ" in result.stdout


def test_a_mixed_precision_repair_is_made_and_its_twin_checked_bit_for_bit(tmp_path: Path) -> None:
    """A repair: INT4 g32 on every linear but the k_proj and down_proj kinds, kept in INT8 per
    channel (a second config group by exact names). Its twin is decoded by transformers and checked
    bit for bit against compressed-tensors' model-free decompression, which decodes the named
    group first (make_candidates.decompressed_weights): a wrong order decodes the INT8 modules as
    INT4 and the check fails."""
    from infra.demo_models import convert_demo_baseline, make_repair

    baseline = convert_demo_baseline(SESSION_MODELS)
    option = {"weights": "int4/group32", "kept_layers": [], "kept_kinds": ["k_proj", "down_proj"],
              "kept_as": "int8/channel"}
    twin = make_repair(baseline, tmp_path, "mixed", option, _lc_python())
    assert twin == tmp_path / "mixed-dequant" and is_complete(twin)
    config = json.loads((tmp_path / "mixed" / "config.json").read_text())["quantization_config"]
    bits = {tuple(group["targets"])[0]: group["weights"]["num_bits"]
            for group in config["config_groups"].values()}
    assert bits["Linear"] == 4 and sorted(bits.values()) == [4, 8] and len(bits) == 2
    kept = next(group["targets"] for group in config["config_groups"].values()
                if group["weights"]["num_bits"] == 8)
    assert len(kept) == 60 and all(name.endswith(("k_proj", "down_proj")) for name in kept)
    emulated = json.loads((twin / "config.json").read_text())[EMULATED_KEY]
    assert emulated["verified"]["quantized_layers"] == 210

    def error(name: str) -> float:
        with safe_open(baseline / "model.safetensors", "pt") as b, \
                safe_open(twin / "model.safetensors", "pt") as t:
            w, d = b.get_tensor(name).float(), t.get_tensor(name).float()
        return float((d - w).norm() / w.norm())

    # INT8 per channel rounds ~1 % of a weight's norm, INT4 g32 ~10 %.
    assert error("model.layers.3.self_attn.k_proj.weight") < 0.02
    assert error("model.layers.3.self_attn.q_proj.weight") > 0.05
