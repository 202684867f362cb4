"""A second engine beside a stage's own: the same settings and cores, its own port and log."""

from __future__ import annotations

from pathlib import Path

from flows.plan import Stage
from flows.spec import Spec
from infra.engine import engine_class
from infra.vllm_engine import free_port, port_free

# Ports beside the stage's: the load reference takes +1, the baseline scoring more items +2.
REFERENCE_PORT_OFFSET = 1
BASELINE_PORT_OFFSET = 2


def engine_beside(spec: Spec, stage: Stage, log_path: Path, port_offset: int):
    """`stage`'s engine (a context manager giving its facts) on the stage's port + offset, or a
    free port when that one is taken (or none was set)."""
    engine = spec.engine
    if engine.kind == "vllm" and engine.port is not None:
        port = engine.port + port_offset
        engine = engine.model_copy(
            update={"port": port if port_free(engine.host, port) else free_port()})
    return engine_class(engine.kind)(engine, stage.checkpoint, stage.engine_flags, log_path,
                                     stage.name)
