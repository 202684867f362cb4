"""What one stage measured, as gates read it: stored in a folder, reloadable a week later."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field

from evalsets.results import QualityItem, QualityResult, TaskQuality
from infra.engine import EngineFacts
from load.results import LoadResult, PairedLoad


class StageRecord(BaseModel):
    name: str
    kind: str
    parent: str | None
    axes: dict[str, str]
    changed: list[str] = Field(default_factory=list)
    emulated: bool = Field(default=False, description="Weights dequantized: speed not representative.")
    fingerprint: str | None = None
    facts: EngineFacts | None = None
    quality: QualityResult | None = None
    load: LoadResult | None = None
    paired_load: PairedLoad | None = Field(
        default=None,
        description="Timed stages: interleaved rounds against the reference (the latency gate).",
    )
    error: str | None = Field(default=None, description="Why the stage could not finish.")
    measured_in: str | None = Field(
        default=None, description="The run folder that measured it (else than this run's: the "
        "stage came from the stage cache).")
    measured_at: str | None = Field(default=None, description="When it finished (UTC, ISO 8601).")
    cache_key: str | None = None

    def save(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "stage.json").write_text(self.model_dump_json(indent=1))

    @classmethod
    def read(cls, folder: Path) -> StageRecord:
        return cls.model_validate_json((folder / "stage.json").read_text())


class RunManifest(BaseModel):
    """The results folder's index: which candidate, which stages in run order."""

    candidate: str
    stages: list[str]
    spec_path: str | None = None
    registry_version: str | None = Field(default=None, description="model@version judged.")
    reused: dict[str, str] = Field(
        default_factory=dict, description="Stages taken from the stage cache, with their keys.")
    engine_starts: list[str] = Field(
        default_factory=list, description="Logs of the engines this run started, in order.")
    cache_keys: dict[str, str] = Field(default_factory=dict, description="Each stage's cache key.")
    host_slot: list[str] = Field(
        default_factory=list, description="When the run held its engine host (UTC, from, to).")

    def save(self, results_dir: Path) -> None:
        results_dir.mkdir(parents=True, exist_ok=True)
        (results_dir / "manifest.json").write_text(self.model_dump_json(indent=1))

    @classmethod
    def read(cls, results_dir: Path) -> RunManifest:
        return cls.model_validate_json((results_dir / "manifest.json").read_text())


def paired_items(first: TaskQuality, second: TaskQuality | None) -> list[tuple[QualityItem, QualityItem]]:
    """Items of both, matched by id, in `first`'s order."""
    if second is None:
        return []
    theirs = {item.id: item for item in second.items}
    return [(item, theirs[item.id]) for item in first.items if item.id in theirs]
