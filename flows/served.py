"""What an engine says it serves, checked against the stage's derived axes before measuring."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flows.axes import CALIBRATED, KV_CACHE_DTYPES, ONLINE_QUANTIZATION, checkpoint_axes
from flows.plan import Stage
from infra.errors import EngineError, SpecError
from infra.kv_axis import split_skipped
from infra.vllm_facts import CONFIG_KEYS, engine_config  # noqa: F401 (engine_config: tests)

# Methods vLLM swaps in for a checkpoint's own (faster kernels, same numbers).
KERNEL_UPGRADES = {"gptq": ("gptq_marlin", "gptq_bitblas"), "awq": ("awq_marlin",)}
TORCH_DTYPES = {"half": "float16", "float": "float32"}
WEIGHT_LOAD_FORMATS = ("auto", "safetensors", "pt")  # the checkpoint's own weights, as stored


class ServedMismatchError(EngineError):
    """The engine serves something other than what the stage's axes say."""


@dataclass
class Served:
    """What a running engine reports about itself."""

    model_root: str | None = None  # /v1/models "root": the model path it loaded
    cache_dtype: str | None = None  # /metrics vllm:cache_config_info cache_dtype
    cache_skip_layers: list[int] | None = None  # its kv_cache_dtype_skip_layers (None: unsaid)
    config: dict[str, str] = field(default_factory=dict)  # the start-up log's engine config
    config_from: str = "its start-up log"  # where `config` was read, for the messages
    # Why `config` lacks keys, with {missing} for them (the engine kind's config_source()).
    unreadable: str = ("its start-up log has no engine config line with {missing} (vLLM's "
                       "'Initializing a V1 LLM engine ... with config:')")


def _none(value: str | None) -> str | None:
    return None if value in (None, "", "None") else value


def _served_weights(stage: Stage, method: str | None,
                    checkpoint_config: dict[str, Any]) -> tuple[str, str] | str:
    """(weights, activations) the engine serves with `method`, or why they cannot be told."""
    qc = checkpoint_config.get("quantization_config")
    own = str(qc.get("quant_method", "")).lower() if qc else None
    if method is None:
        if own:
            return f"no quantization, though the checkpoint declares quant_method {own!r}"
        # A dequantized (emulated) checkpoint is served unquantized, as its axes expect.
        return (stage.axes.weights, stage.axes.activations) if stage.axes.emulated else ("none", "none")
    if own and (method == own or method in KERNEL_UPGRADES.get(own, ())):
        try:
            weights, activations, _ = checkpoint_axes(qc)
        except SpecError as err:
            return f"quantization {method!r} ({err})"
        return weights, activations
    if not own and method in ONLINE_QUANTIZATION and method == stage.engine_flags.quantization:
        return stage.axes.weights, stage.axes.activations  # derived from this method and device
    if not own and method in ONLINE_QUANTIZATION:
        online = ONLINE_QUANTIZATION[method]
        return online.get("weights", "none"), online.get("activations", "none")
    return (f"quantization {method!r}, which neither its checkpoint "
            f"({own or 'unquantized'}) nor its engine_flags.quantization declare")


def mismatches(stage: Stage, served: Served, checkpoint_config: dict[str, Any],
               dtype: str | None = None, external: bool = False) -> list[str]:
    """Each way the engine's own report disagrees with the stage, as a sentence; [] when it
    serves what the axes say. `dtype`: engine.dtype (None: not checked). An external engine is
    judged on what it exposes (/metrics); quantgate's own vLLM must also show its start-up log."""
    name, axes, problems = stage.name, stage.axes, []
    kv_axis, skipped = split_skipped(axes.kv_cache)
    kv = served.cache_dtype or served.config.get("kv_cache_dtype")
    if kv is not None and KV_CACHE_DTYPES.get(kv, kv) != kv_axis.removesuffix(CALIBRATED):
        problems.append(f"stage {name} serves kv_cache {KV_CACHE_DTYPES.get(kv, kv)} "
                        f"but its axes say {axes.kv_cache}")
    if served.cache_skip_layers is not None and sorted(served.cache_skip_layers) != list(skipped):
        problems.append(f"stage {name} keeps the model dtype on KV layers "
                        f"{sorted(served.cache_skip_layers) or 'none'} but its axes say "
                        f"{axes.kv_cache}")
    if kv_axis.endswith(CALIBRATED) and served.config.get("kv_scales") == "1.0":
        problems.append(f"stage {name} serves its KV cache on vLLM's default scales 1.0 "
                        f"({served.config_from}) but its axes say {axes.kv_cache}: the "
                        "checkpoint's kv_cache_scheme scales were not loaded")
    if external:
        return problems
    config = served.config
    missing = [key for key in CONFIG_KEYS if key not in config]
    if missing:
        reason = served.unreadable.format(missing=", ".join(missing))
        problems.append(f"stage {name}: cannot tell what the engine serves: {reason}; not measured")
        return problems
    checkpoint = Path(stage.checkpoint).resolve()
    wrong: dict[str, list[str]] = {}
    for source, model in (("/v1/models", served.model_root), (served.config_from, config["model"])):
        if model is not None and Path(model).resolve() != checkpoint:
            wrong.setdefault(model, []).append(source)
    for model, sources in wrong.items():
        problems.append(f"stage {name} serves model {model} ({', '.join(sources)}) but its "
                        f"checkpoint is {checkpoint}")
    method = _none(config["quantization"])
    weights = _served_weights(stage, method, checkpoint_config)
    if isinstance(weights, str):
        problems.append(f"stage {name} serves {weights}; its axes say {axes.describe()}")
    else:
        for axis, value in zip(("weights", "activations"), weights, strict=True):
            if value != getattr(axes, axis):
                problems.append(f"stage {name} serves {axis} {value} (quantization "
                                f"{method or 'none'}) but its axes say {getattr(axes, axis)}")
    if dtype not in (None, "auto"):
        want = TORCH_DTYPES.get(dtype, dtype)
        got = config["dtype"].removeprefix("torch.")
        if got != want:
            problems.append(f"stage {name} serves dtype {got} but engine.dtype is {dtype}")
    if config["load_format"] not in WEIGHT_LOAD_FORMATS:
        problems.append(f"stage {name} loads its weights with load_format {config['load_format']}, "
                        "not the checkpoint's own")
    return problems


def observe(facts, engine_spec, log_path: Path | None) -> Served:
    """Ask the running engine: /v1/models for the model root, its kind for the configuration
    it serves (vLLM's start-up log, SGLang's /get_server_info); the KV dtype is what /metrics
    said at start-up, already in the engine's `facts`. An engine that does not report its
    configuration (an external one) is judged on /metrics: its model root is another host's path."""
    import httpx

    from infra.engine import engine_class
    from infra.probe import model_entry

    if log_path is None or not engine_spec.reports_config:
        return Served(cache_dtype=facts.kv_cache_dtype, cache_skip_layers=facts.kv_cache_skip_layers)
    try:
        root = model_entry(facts.base_url, facts.model).get("root")
    except (httpx.HTTPError, ValueError) as err:
        raise EngineError(f"engine at {facts.base_url} stopped answering /v1/models: {err}") from err
    log_text = log_path.read_text(errors="replace") if log_path.exists() else ""
    kind = engine_class(engine_spec.kind)
    return Served(model_root=root, cache_dtype=facts.kv_cache_dtype,
                  cache_skip_layers=facts.kv_cache_skip_layers,
                  config=kind.served_config(facts, log_text), config_from=kind.config_from,
                  unreadable=engine_spec.config_source())


def kernel_mismatches(stage: Stage, facts) -> list[str]:
    """What the kernels the engine picked contradict in the stage's axes: FP8 activations on a
    GPU without FP8 units, where vLLM runs FP8 weights through Marlin (weight-only)."""
    if getattr(facts, "fp8_marlin_fallback", False) and stage.axes.activations.startswith("float8"):
        return [f"stage {stage.name}: vLLM ran its FP8 weights through the Marlin fallback (this "
                "GPU has no FP8 units: weights only, activations unquantized) but its axes say "
                f"activations {stage.axes.activations}; serve it on a GPU with FP8 (sm89+: L40S, "
                "H100, B200), or measure a weights stage there instead"]
    return []


def check_served(stage: Stage, facts, engine_spec, log_path: Path | None) -> None:
    """Raise ServedMismatchError when the engine serving `stage` does not serve its axes."""
    from infra.checkpoint import read_config

    external = not engine_spec.reports_config
    served = observe(facts, engine_spec, log_path)
    config = {} if external else read_config(stage.checkpoint)
    problems = mismatches(stage, served, config, dtype=getattr(engine_spec, "dtype", None),
                          external=external) + kernel_mismatches(stage, facts)
    if problems:
        where = f" (log {log_path})" if log_path and not external else ""
        raise ServedMismatchError("; ".join(problems) + where)
