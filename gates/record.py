"""What one stage measured, as gates read it: stored in a folder, reloadable a week later."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, Field, PrivateAttr

from evalsets.results import MoreItems, QualityItem, QualityResult, TaskQuality
from gates.comparability import Comparability
from infra.engine import EngineFacts
from infra.stored import Stored, StoredRecordError, stored_object, validated
from load.results import LoadResult, PairedLoad

# The layout of stage.json: 2 keeps the stage's results in their own files (quality/quality.json,
# load/load.json, load/paired.json), each stored once; layout 1 embedded them. Bump it when a
# change would make an older quantgate misread a record.
SCHEMA_VERSION = 2
# The names a spec allows (flows/spec.py Spec.candidate, StageSpec.name): a stored name outside
# them was not written by quantgate.
CANDIDATE_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]*"
STAGE_NAME = r"[a-z0-9][a-z0-9_-]*"
STAGE_KINDS = ("baseline", "weights", "activations", "kv_cache", "weights_activations", "control",
               "structured_output", "repair")
# A stage's results, each in its own file under the stage folder: field -> (subfolder, model).
RESULTS: dict[str, tuple[str, type[Stored]]] = {
    "quality": ("quality", QualityResult), "load": ("load", LoadResult),
    "paired_load": ("load", PairedLoad)}


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


class StageRecord(Stored):
    """A stage as stored: stage.json, and its results in their own files (RESULTS)."""

    FILE: ClassVar[str] = "stage.json"
    LAYOUT: ClassVar[int] = SCHEMA_VERSION
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
    weight_mix: dict[str, float] | None = Field(
        default=None, description="A checkpoint whose config groups give its decoder matmuls "
        "more than one weight format: each format's share of their weights ('none': left in the "
        "model's dtype), as compressed-tensors places them; what the what-if streams per token.")
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

    # Read with the items it answered for later stages (MoreItems): its quality as measured.
    _own_quality: QualityResult | None = PrivateAttr(default=None)

    def save(self, folder: Path) -> Path:
        """stage.json, and each result in its own file: stored once, where its stage wrote it
        (the quality as its own stage measured it: more items answered later stay theirs)."""
        folder.mkdir(parents=True, exist_ok=True)
        for name, (sub, _) in RESULTS.items():
            result = getattr(self, name)
            if name == "quality" and self._own_quality is not None:
                result = self._own_quality
            if result is not None:
                result.save(folder / sub)
        return super().save(folder)

    def stored_data(self) -> dict[str, Any]:
        data = self.model_dump(mode="json", exclude=set(RESULTS)) | {"schema_version": self.LAYOUT}
        return data | {"results": {name: None if getattr(self, name) is None
                                   else f"{sub}/{model.FILE}"
                                   for name, (sub, model) in RESULTS.items()}}

    @classmethod
    def read(cls, folder: Path) -> StageRecord:
        path = folder / cls.FILE
        data, version = stored_object(path, cls.LAYOUT)
        if version == 1:  # its results embedded
            record = validated(path, data, version, cls)
        else:
            results = _result_files(path, data.pop("results", None))
            inside = sorted(set(RESULTS) & set(data))
            if inside:  # read as measured, it would stand in for what the results' files hold
                raise StoredRecordError(
                    f"{path}: schema {version} record with {', '.join(map(repr, inside))} inside "
                    "it; this layout keeps each result in its own file (named by 'results'): "
                    "the record was edited or damaged: re-run the acceptance")
            record = validated(path, data, version, cls, verdict_fields=tuple(
                name for name in cls.VERDICT_FIELDS if name not in RESULTS))
            for name, (sub, model) in RESULTS.items():
                if results[name] is not None:
                    setattr(record, name, model.read(folder / sub))
        more = MoreItems.kept(folder)
        if more is not None and record.quality is not None:
            record._own_quality = record.quality
            record.quality = with_more_items(record.quality, more, folder)
        if record.comparability is None and record.error is None:
            # Every stage this layout measured records what it was served: a null here would
            # skip the comparability rule as "not recorded", a pass nobody checked.
            raise StoredRecordError(
                f"{path}: comparability is null in a stage that finished (error is null); "
                "quantgate records what every measured stage was served, so the rule cannot be "
                "skipped: the record was edited or written by an older quantgate: re-run the "
                "acceptance")
        return record


def with_more_items(quality: QualityResult, more: MoreItems, folder: Path) -> QualityResult:
    """A stage's quality with the items it answered later for other stages' looks: what those
    stages pair with. `own_sizes` keeps what its own verdict rests on (gates.checks)."""
    merged = quality.model_copy(deep=True)
    if merged.own_sizes is None:
        merged.own_sizes = {name: len(task.items) for name, task in quality.tasks.items()}
    for name, items in more.tasks.items():
        if name not in merged.tasks:
            raise StoredRecordError(
                f"{folder / MoreItems.FOLDER / MoreItems.FILE}: items of set {name!r}, which the "
                "stage did not measure; the record was edited or damaged: re-run the acceptance")
        merged.tasks[name].extend(items)
    return merged


def _result_files(path: Path, results: object) -> dict[str, str | None]:
    """stage.json's `results`: for each result, its file in the stage folder or null (not
    measured); anything else (a result left out, another file, a path out of the folder) is not
    what quantgate writes."""
    expected = {name: f"{sub}/{model.FILE}" for name, (sub, model) in RESULTS.items()}
    if not isinstance(results, dict) or set(results) != set(expected) or any(
            value is not None and value != expected[name] for name, value in results.items()):
        raise StoredRecordError(
            f"{path}: 'results' is {results!r:.200}, not each result's file or null "
            f"({', '.join(f'{n}: {f}' for n, f in expected.items())}); the record was edited or "
            "damaged: re-run the acceptance")
    return results


class RunManifest(Stored):
    """The results folder's index: which candidate, which stages in run order."""

    FILE: ClassVar[str] = "manifest.json"
    schema_version: int = Field(default=1, description="Layout of manifest.json.")
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


def paired_items(first: TaskQuality, second: TaskQuality | None) -> list[tuple[QualityItem, QualityItem]]:
    """Items of both, matched by id, in `first`'s order."""
    if second is None:
        return []
    theirs = {item.id: item for item in second.items}
    return [(item, theirs[item.id]) for item in first.items if item.id in theirs]
