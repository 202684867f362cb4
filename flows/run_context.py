"""What each stage of one acceptance run is measured with, and what the stages before it left."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from flows.cache import StageCache
from flows.engines import KeptEngines
from flows.preflight import Prepared
from flows.settings import Settings
from flows.tracking import Tracker
from gates.record import RunManifest, StageRecord


@dataclass
class RunContext:
    """One run's stages share these. `cache`, `parts`, `keys`: the stage cache and each stage's
    key (its parts and their digest); `records`: the stages measured so far; `reused`: those
    restored from the cache (their engines are not up to race); `kept`: engines left serving for
    later stages; `keep_until`: stage name -> index of the last stage that may use its engine."""

    prepared: Prepared
    results_dir: Path
    settings: Settings
    no_cache: bool
    manifest: RunManifest
    tracker: Tracker
    cache: StageCache
    parts: dict
    keys: dict[str, str]
    kept: KeptEngines
    keep_until: dict[str, int]
    records: dict[str, StageRecord] = field(default_factory=dict)
    reused: set[str] = field(default_factory=set)
