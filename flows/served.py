"""What an engine says it serves, checked against the stage's derived axes before measuring."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flows.axes import CALIBRATED, KV_CACHE_DTYPES, ONLINE_QUANTIZATION, checkpoint_axes
from flows.plan import Stage
from infra.errors import EngineError, SpecError

# vLLM logs its resolved engine configuration once at start-up (V1: "Initializing a V1 LLM
# engine (v0.32.0) with config: model='...', ..., dtype=torch.bfloat16, ...,
# quantization=compressed-tensors, ..., kv_cache_dtype=auto, ..."); older builds say "an LLM".
CONFIG_LINE = re.compile(r"Initializing an? (?:V1 )?LLM engine \([^)]*\) with config: (?P<body>.*)$",
                         re.MULTILINE)
CONFIG_KEYS = ("model", "dtype", "quantization", "kv_cache_dtype", "load_format")
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
    config: dict[str, str] = field(default_factory=dict)  # the start-up log's engine config


def engine_config(log_text: str) -> dict[str, str]:
    """CONFIG_KEYS from the last engine-config line of a vLLM start-up log ({} when none).
    Values are as logged, quotes removed: 'None', 'torch.bfloat16', 'compressed-tensors'."""
    lines = CONFIG_LINE.findall(log_text)
    if not lines:
        return {}
    fields = dict(_top_level_fields(lines[-1]))
    return {key: fields[key].strip("'\"") for key in CONFIG_KEYS if key in fields}


def _top_level_fields(body: str) -> list[tuple[str, str]]:
    """`a=1, b=X(c=2, d=3), e='f, g'` -> [(a, 1), (b, X(...)), (e, 'f, g')]: nested values
    (configs, dicts, quoted paths with commas) stay whole."""
    fields, depth, quote, start = [], 0, "", 0
    for index, char in enumerate(body + ","):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        elif char == "," and depth == 0:
            key, _, value = body[start:index].strip().partition("=")
            fields.append((key.strip(), value.strip()))
            start = index + 1
    return fields


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
    kv = served.cache_dtype or served.config.get("kv_cache_dtype")
    if kv is not None and KV_CACHE_DTYPES.get(kv, kv) != axes.kv_cache.removesuffix(CALIBRATED):
        problems.append(f"stage {name} serves kv_cache {KV_CACHE_DTYPES.get(kv, kv)} "
                        f"but its axes say {axes.kv_cache}")
    if external:
        return problems
    config = served.config
    missing = [key for key in CONFIG_KEYS if key not in config]
    if missing:
        problems.append(f"stage {name}: cannot tell what the engine serves: its start-up log has "
                        f"no engine config line with {', '.join(missing)} (vLLM's 'Initializing "
                        "a V1 LLM engine ... with config:'); not measured")
        return problems
    checkpoint = Path(stage.checkpoint).resolve()
    wrong: dict[str, list[str]] = {}
    for source, model in (("/v1/models", served.model_root), ("its start-up log", config["model"])):
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


def observe(base_url: str, model: str, cache_dtype: str | None, log_path: Path | None) -> Served:
    """Ask the running engine: /v1/models for the model root, the start-up log for the config
    (`cache_dtype`: what /metrics said at start-up, already in the engine's facts). Without a
    log (an external engine) only /metrics counts: its model root is a path on another host."""
    import httpx

    from infra.probe import model_entry

    if log_path is None:
        return Served(cache_dtype=cache_dtype)
    try:
        root = model_entry(base_url, model).get("root")
    except (httpx.HTTPError, ValueError) as err:
        raise EngineError(f"engine at {base_url} stopped answering /v1/models: {err}") from err
    log_text = log_path.read_text(errors="replace") if log_path.exists() else ""
    return Served(model_root=root, cache_dtype=cache_dtype, config=engine_config(log_text))


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

    external = engine_spec.kind == "external"
    served = observe(facts.base_url, facts.model, facts.kv_cache_dtype,
                     None if external else log_path)
    config = {} if external else read_config(stage.checkpoint)
    problems = mismatches(stage, served, config, dtype=getattr(engine_spec, "dtype", None),
                          external=external) + kernel_mismatches(stage, facts)
    if problems:
        where = f" (log {log_path})" if log_path and not external else ""
        raise ServedMismatchError("; ".join(problems) + where)
