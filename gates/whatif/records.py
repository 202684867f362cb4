"""The what-if's inputs read from stored stage records: model shape, KV pool, measured latency."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gates.record import RunManifest, StageRecord
from gates.whatif.search import Workload
from infra.errors import QuantgateError
from load.profile import LoadProfile, load_profile, profile_path


@dataclass(frozen=True)
class StageShape:
    """A stage's config.json model-shape keys and where they came from (None: nowhere)."""

    config: dict[str, Any] | None
    source: str


def _model_path(record: StageRecord) -> str | None:
    command = record.facts.command if record.facts else []
    for index, arg in enumerate(command):
        if arg == "--model" and index + 1 < len(command):
            return command[index + 1]
        if arg.startswith("--model="):
            return arg.split("=", 1)[1]
    return None


def stage_shape(record: StageRecord) -> StageShape:
    """The record's `shape`; for records written before it was kept, config.json of the
    checkpoint the engine served (`--model` of its command line). Never a guess: when neither
    is there, config is None and source says why."""
    if record.shape:
        return StageShape(dict(record.shape), "model shape kept in the stage record")
    model = _model_path(record)
    if model is None:
        return StageShape(None, "the record keeps no model shape and no engine command line "
                          "naming its checkpoint: no what-if for this stage")
    config = Path(model) / "config.json"
    try:
        return StageShape(json.loads(config.read_text()),
                          f"{config} (the record predates the kept model shape)")
    except (OSError, ValueError) as err:
        return StageShape(None, f"the record keeps no model shape and {config} cannot be read "
                          f"({getattr(err, 'strerror', None) or err}): no what-if for this stage")


def served_axes(record: StageRecord) -> dict[str, Any]:
    """The record's axes as the what-if reads them: with a mixed checkpoint's weight shares."""
    return record.axes | ({"weight_mix": record.weight_mix} if record.weight_mix else {})


def kv_cache_gib(record: StageRecord) -> float | None:
    """The KV pool the engine had (VLLM_CPU_KVCACHE_SPACE on a CPU), GiB; None: not recorded."""
    if record.facts and record.facts.kv_cache_bytes:
        return record.facts.kv_cache_bytes / 2**30
    return None


def low_load_measured(record: StageRecord) -> tuple[float, float] | None:
    """(TTFT p50 ms, TPOT p50 ms) of the low level with one user; None when not measured."""
    summary = record.load.summaries.get("low") if record.load else None
    if summary is None or summary.users != 1 or not summary.ttft_p50_ms or not summary.tpot_p50_ms:
        return None
    return summary.ttft_p50_ms, summary.tpot_p50_ms


def busy_measured(record: StageRecord) -> tuple[int, float] | None:
    """(users, TPOT p50 ms) of the high level; None when it was not measured with >1 user."""
    summary = record.load.summaries.get("high") if record.load else None
    if summary is None or summary.users < 2 or not summary.tpot_p50_ms:
        return None
    return summary.users, summary.tpot_p50_ms


def spec_profile(spec: Path, profile: str) -> tuple[LoadProfile, str]:
    """The load profile a spec names (a relative YAML path is relative to the spec, as the
    acceptance flow reads it) and where it came from."""
    if profile.endswith((".yaml", ".yml")) and not Path(profile).is_absolute():
        profile = str(spec.resolve().parent / profile)
    return load_profile(profile), f"load profile {profile_path(profile)} (from {spec})"


def run_profile(results_dir: Path) -> tuple[LoadProfile, str]:
    """The load profile a results folder's run ran, as it sized it (kept in the folder,
    gates.run_inputs: described as the run's own report describes it); for a run from before
    inputs were kept, the one its spec names, read again from the path the manifest kept
    (QuantgateError when the spec or profile is gone)."""
    from gates.run_inputs import RunInputs

    kept = RunInputs.kept(results_dir)
    if kept is not None:
        return kept.load_profile, f"load profile {kept.load_profile_name}"
    spec_path = RunManifest.read(results_dir).spec_path
    if not spec_path:
        raise QuantgateError(f"{results_dir / 'manifest.json'} keeps no spec path: name the load "
                             "profile (--profile)")
    spec = Path(spec_path)
    try:
        profile = (yaml.safe_load(spec.read_text()) or {}).get("load_profile", "demo")
    except (OSError, yaml.YAMLError, AttributeError) as err:
        raise QuantgateError(f"the run's spec {spec} cannot be read ({err}): name the load "
                             "profile (--profile)") from err
    return spec_profile(spec, str(profile))


def run_workload(results_dir: Path) -> tuple[Workload, str]:
    """The workload of a results folder's run: the load profile its spec named."""
    from gates.whatif import workload_from_profile

    found, origin = run_profile(results_dir)
    return workload_from_profile(found), origin
