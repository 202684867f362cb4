"""What one stage measured, as gates read it: stored in a folder, reloadable a week later."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel, Field, ValidationError

from evalsets.results import QualityItem, QualityResult, TaskQuality
from gates.comparability import Comparability
from infra.engine import EngineFacts
from infra.errors import QuantgateError
from load.results import LoadResult, PairedLoad

# The layout of stage.json and manifest.json. Bump it when a change would make an older
# quantgate misread a record; records written before the field existed are layout 1.
SCHEMA_VERSION = 1
# The names a spec allows (flows/spec.py Spec.candidate, StageSpec.name): a stored name outside
# them was not written by quantgate.
CANDIDATE_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]*"
STAGE_NAME = r"[a-z0-9][a-z0-9_-]*"
STAGE_KINDS = ("baseline", "weights", "activations", "kv_cache", "weights_activations", "control",
               "structured_output")

Record = TypeVar("Record", bound=BaseModel)


class StoredRecordError(QuantgateError):
    """A stored record (stage.json, manifest.json) is missing, damaged or of another layout."""


def read_record(path: Path, model: type[Record]) -> Record:
    """A stored record, refused with the file, the version found and what to do when it is not
    one this quantgate can read: a record misread is a verdict on numbers nobody measured."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as err:
        raise StoredRecordError(f"{path}: missing; the results folder is incomplete: re-run "
                                "the acceptance") from err
    except (OSError, UnicodeDecodeError) as err:
        raise StoredRecordError(f"{path}: cannot be read ({err}); the results folder is "
                                "damaged: re-run the acceptance") from err
    try:
        data = json.loads(text)
    except ValueError as err:
        raise StoredRecordError(f"{path}: not valid JSON ({err}); the results folder is damaged: "
                                "re-run the acceptance") from err
    if not isinstance(data, dict):
        raise StoredRecordError(f"{path}: expected a JSON object, got {type(data).__name__}; the "
                                "results folder is damaged: re-run the acceptance")
    version = data.get("schema_version", 1)  # written before the field existed: layout 1
    if type(version) is not int or version < 1:
        raise StoredRecordError(f"{path}: unknown schema version {version!r} (this quantgate "
                                f"reads {SCHEMA_VERSION}); the record is damaged: re-run the "
                                "acceptance")
    if version > SCHEMA_VERSION:
        raise StoredRecordError(f"{path}: written by a newer quantgate (schema {version}, this "
                                f"one reads {SCHEMA_VERSION}): upgrade quantgate to gate it")
    try:
        record = model.model_validate(data)
    except ValidationError as err:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(top level)'}: {e['msg']}"
                             for e in err.errors()[:3])
        raise StoredRecordError(f"{path}: schema {version} but not a valid {model.__name__} "
                                f"({problems}); damaged or older layout: re-run, or re-gate with "
                                "the quantgate that wrote it") from err
    # quantgate writes every field, null or not: a field the verdict reads that is absent was
    # taken out, and its default in its place would judge what was never stored.
    absent = [name for name in getattr(model, "VERDICT_FIELDS", ()) if name not in data]
    if absent:
        raise StoredRecordError(f"{path}: schema {version} record without "
                                f"{', '.join(map(repr, absent))}, which every {model.__name__} of "
                                "this layout carries (null where nothing was measured) and the "
                                "verdict reads; the record was edited or damaged: re-run the "
                                "acceptance")
    return record


class SetTiming(BaseModel):
    items: int
    output_tokens: int = Field(description="Tokens the engine generated for the set.")
    seconds: float | None


class StageTimings(BaseModel):
    """Where a stage's wall time went. Engine-busy time is the time it was sent work (eval sets,
    corpus scoring, more items, load and capacity search); the rest of the wall time beyond
    start-up is the pipeline's own overhead."""

    wall_s: float = Field(description="From the stage's start to its record, engines stopped.")
    startup_s: float | None = Field(
        default=None, description="Engine launch to healthy (with the reference engine's).")
    sets: dict[str, SetTiming] = Field(default_factory=dict)
    scoring_s: float | None = Field(default=None, description="Perplexity / divergence corpus.")
    more_items_s: float | None = Field(default=None, description="Adaptive looks (more items).")
    load_s: float | None = Field(default=None, description="Load levels and capacity search.")
    load_levels_s: dict[str, float] = Field(default_factory=dict)
    capacity_s: float | None = Field(default=None, description="Capacity search, of load_s.")

    @property
    def busy_s(self) -> float:
        sets = sum(timing.seconds or 0.0 for timing in self.sets.values())
        return sets + (self.scoring_s or 0.0) + (self.more_items_s or 0.0) + (self.load_s or 0.0)

    @property
    def overhead_s(self) -> float:
        return max(0.0, self.wall_s - (self.startup_s or 0.0) - self.busy_s)


class StageRecord(BaseModel):
    # Fields with a default that the verdict reads: a stored record must carry them (as null
    # where nothing was measured), else `emulated` or `error` taken out would judge by defaults.
    VERDICT_FIELDS: ClassVar[tuple[str, ...]] = (
        "emulated", "error", "facts", "quality", "load", "paired_load", "comparability")

    schema_version: int = Field(default=SCHEMA_VERSION, description="Layout of stage.json.")
    name: str
    kind: str
    parent: str | None
    axes: dict[str, str]
    changed: list[str] = Field(default_factory=list)
    request_options: dict[str, Any] | None = Field(
        default=None, description="What the stage adds to its parent's requests (a "
        "structured_output stage: response_format): its declared change, not a generation "
        "setting.")
    emulated: bool = Field(default=False, description="Weights dequantized: speed not representative.")
    fingerprint: str | None = None
    shape: dict[str, Any] | None = Field(
        default=None, description="The model-shape keys of the checkpoint's config.json (layers, "
        "widths, heads, vocabulary): what the capacity what-if predicts from.")
    facts: EngineFacts | None = None
    quality: QualityResult | None = None
    load: LoadResult | None = None
    paired_load: PairedLoad | None = Field(
        default=None,
        description="Timed stages: interleaved rounds against the reference (the latency gate).",
    )
    error: str | None = Field(default=None, description="Why the stage could not finish.")
    timings: StageTimings | None = Field(default=None, description="Where the wall time went.")
    measured_in: str | None = Field(
        default=None, description="The run folder that measured it (else than this run's: the "
        "stage came from the stage cache).")
    measured_at: str | None = Field(default=None, description="When it finished (UTC, ISO 8601).")
    cache_key: str | None = None
    comparability: Comparability | None = Field(
        default=None, description="Chat template and tokenizer hashes, generation settings and "
        "first-look items per set, load profile hash: what the comparability rule compares. "
        "None in records stored before it was kept (their item ids are still compared).")

    def save(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "stage.json").write_text(self.model_dump_json(indent=1))

    @classmethod
    def read(cls, folder: Path) -> StageRecord:
        path = folder / "stage.json"
        record = read_record(path, cls)
        if record.comparability is None and record.error is None:
            # Every stage this layout measured records what it was served: a null here would
            # skip the comparability rule as "not recorded", a pass nobody checked.
            raise StoredRecordError(
                f"{path}: comparability is null in a stage that finished (error is null); "
                "quantgate records what every measured stage was served, so the rule cannot be "
                "skipped: the record was edited or written by an older quantgate: re-run the "
                "acceptance")
        return record


class RunManifest(BaseModel):
    """The results folder's index: which candidate, which stages in run order."""

    schema_version: int = Field(default=SCHEMA_VERSION, description="Layout of manifest.json.")
    candidate: str
    stages: list[str]
    spec_path: str | None = None
    registry_version: str | None = Field(default=None, description="model@version judged.")
    reused: dict[str, str] = Field(
        default_factory=dict, description="Stages taken from the stage cache, with their keys.")
    engine_starts: list[str] = Field(
        default_factory=list, description="Logs of the engines this run started, in order.")
    cache_keys: dict[str, str] = Field(default_factory=dict, description="Each stage's cache key.")
    timings: dict[str, float] = Field(
        default_factory=dict, description="Run phases in seconds: wall, stages, gating, reporting.")
    host_slot: list[str] = Field(
        default_factory=list, description="When the run held its engine host (UTC, from, to).")
    placement: dict | None = Field(
        default=None, description="Where the CUDA engines went (infra/placement.py): GPUs and "
        "memory share per engine role; None off CUDA.")

    def save(self, results_dir: Path) -> None:
        results_dir.mkdir(parents=True, exist_ok=True)
        (results_dir / "manifest.json").write_text(self.model_dump_json(indent=1))

    @classmethod
    def read(cls, results_dir: Path) -> RunManifest:
        return read_record(results_dir / "manifest.json", cls)


def paired_items(first: TaskQuality, second: TaskQuality | None) -> list[tuple[QualityItem, QualityItem]]:
    """Items of both, matched by id, in `first`'s order."""
    if second is None:
        return []
    theirs = {item.id: item for item in second.items}
    return [(item, theirs[item.id]) for item in first.items if item.id in theirs]
