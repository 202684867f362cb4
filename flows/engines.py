"""A second engine beside a stage's own: the same settings and cores, its own port and log."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from flows.plan import Stage
from flows.served import check_served
from flows.spec import Spec
from infra.engine import EngineFacts, engine_class
from infra.vllm_engine import free_port, port_free

# Ports beside the stage's: the load reference takes +1, the baseline scoring more items +2.
REFERENCE_PORT_OFFSET = 1
BASELINE_PORT_OFFSET = 2


@contextlib.contextmanager
def engine_beside(spec: Spec, stage: Stage, log_path: Path, port_offset: int) -> Iterator[EngineFacts]:
    """`stage`'s engine on the stage's port + offset, or a free port when that one is taken (or
    none was set); its facts once it serves what `stage` declares (flows/served.py)."""
    engine = spec.engine
    if engine.kind == "vllm" and engine.port is not None:
        port = engine.port + port_offset
        engine = engine.model_copy(
            update={"port": port if port_free(engine.host, port) else free_port()})
    with engine_class(engine.kind)(engine, stage.checkpoint, stage.engine_flags, log_path,
                                   stage.name) as facts:
        check_served(stage, facts, spec.engine, log_path)
        yield facts
