"""Typed quality results: one row per eval item, paired across stages by item id."""

from __future__ import annotations

import base64
import json
import zlib
from pathlib import Path
from typing import ClassVar

import numpy as np
import pandas as pd
from pydantic import BaseModel, Field

from infra.stored import Stored

# Each set's lm-eval samples log in its quality folder: evalsets.runner writes it, the scoring
# corpus (evalsets.token_corpus) reads the baseline's answers from it.
SAMPLES_FILE = "lm_eval_samples.jsonl"


def sample_folder(folder: Path, index: int) -> Path:
    """Where sample `index` of a sampled set keeps lm-eval's files: `<set>-s<index>`."""
    return folder.with_name(f"{folder.name}-s{index}")


class QualityItem(BaseModel):
    """One eval item as answered by one stage."""

    id: str = Field(description="The item's own id from the eval data (doc['id']), stable across stages.")
    prompt_hash: str = Field(description="sha256 of the prompt text (first 16 hex digits).")
    response: str
    score: float = Field(description="The task's primary metric for this item (1.0 = correct).")
    output_tokens: int | None = Field(default=None, description="Tokens in the response.")
    finish_reason: str | None = Field(default=None, description="'stop' or 'length' when known.")
    group: str | None = Field(
        default=None, description="Sub-group for per-group curves, e.g. a long-context length bucket."
    )
    cluster: str | None = Field(
        default=None, description="Cluster of near-duplicate items (a template, a source document): "
        "items of one cluster are not independent, and intervals resample them together."
    )
    samples: list[float] | None = Field(
        default=None, description="A sampled set (evalsets.sampling): each sample's score, in seed "
        "order; `score` is their mean.")
    reasoning_tokens: int | None = Field(
        default=None, description="Tokens of the reasoning trace split off before scoring (the "
        "engine's reasoning parser or the set's `reasoning_end`); not in `output_tokens`.")


class TaskQuality(BaseModel):
    """Results of one eval task on one stage."""

    task: str = Field(description="Eval set name, e.g. 'math'.")
    metric: str = Field(description="Name of the primary metric, e.g. 'accuracy'.")
    value: float = Field(description="Mean of item scores.")
    items: list[QualityItem]
    seconds: float | None = Field(default=None, description="Wall time of the set's first look.")

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame([item.model_dump() for item in self.items])

    def extend(self, items: list[QualityItem]) -> None:
        """More items of the set (those it holds already are kept as they are), and the mean."""
        known = {item.id for item in self.items}
        self.items += [item for item in items if item.id not in known]
        self.value = sum(item.score for item in self.items) / len(self.items)


class Divergence(BaseModel):
    """How far a stage's next-token distribution moved from the baseline's, on the same tokens.

    Point estimates for display and tracking; the gates compute their intervals from the
    per-token values in `QualityResult.paired_tokens`.
    """

    tokens: int = Field(description="Token positions compared.")
    mean_kl: float = Field(description="Mean per-token top-k coarsened KL(baseline || stage), nats.")
    top1_agreement: float = Field(description="Share of positions with the same most likely token.")
    top_k: int | None = Field(default=None, description="Listed alternatives per position (k).")


class PerplexityRatio(BaseModel):
    """Stage perplexity / reference perplexity on the same corpus tokens (point estimate)."""

    tokens: int = Field(description="Token positions compared.")
    ratio: float = Field(description="exp(mean per-token NLL difference): 1.05 = +5 %.")


def pack(values: np.ndarray | list, dtype: str) -> str:
    """Little-endian array -> zlib -> base64: per-token series stay small inside stage.json."""
    raw = np.ascontiguousarray(np.asarray(values, dtype=np.dtype(dtype).newbyteorder("<")))
    return base64.b64encode(zlib.compress(raw.tobytes(), 6)).decode("ascii")


def unpack(text: str, dtype: str) -> np.ndarray:
    raw = zlib.decompress(base64.b64decode(text))
    return np.frombuffer(raw, dtype=np.dtype(dtype).newbyteorder("<")).astype(float)


class PairedTokens(BaseModel):
    """Per scored corpus position of one stage, against the baseline and the parent.

    Positions are in corpus order; `spans` names consecutive runs of them (one prose text, one
    answer, one prompt), so a bootstrap block never straddles two texts. The series are packed
    (see `pack`); read them with `values(name)`. NLL differences are stage minus reference, in
    nats: their mean is the log of the perplexity ratio.
    """

    top_k: int = Field(description="Alternatives listed per position: the KL's coarsening.")
    spans: list[str] = Field(description="Name of each run of consecutive positions.")
    span_tokens: list[int] = Field(description="Positions in each span, in order.")
    kl: str | None = Field(default=None, description="float32: KL(baseline || stage) per position.")
    top1_agree: str | None = Field(default=None, description="uint8: 1 = same top-1 token.")
    nll_diff_vs_baseline: str | None = Field(default=None, description="float32, stage - baseline.")
    nll_diff_vs_parent: str | None = Field(default=None, description="float32, stage - parent.")

    @property
    def tokens(self) -> int:
        return sum(self.span_tokens)

    def values(self, name: str) -> np.ndarray | None:
        """One series as floats, or None when it was not recorded; checked against the spans."""
        text = getattr(self, name)
        if text is None:
            return None
        values = unpack(text, _DTYPES[name])
        if values.size != self.tokens:
            raise ValueError(f"paired tokens: {name} has {values.size} values for {self.tokens} "
                             f"positions")
        return values

    @classmethod
    def from_values(cls, top_k: int, spans: list[tuple[str, int]], **series) -> PairedTokens:
        """From plain arrays (kl=, top1_agree=, nll_diff_vs_baseline=, nll_diff_vs_parent=)."""
        packed = {name: None if values is None else pack(values, _DTYPES[name])
                  for name, values in series.items()}
        return cls(top_k=top_k, spans=[name for name, _ in spans],
                   span_tokens=[count for _, count in spans], **packed)


_DTYPES = {"kl": "f4", "top1_agree": "u1", "nll_diff_vs_baseline": "f4",
           "nll_diff_vs_parent": "f4"}


class QualityResult(Stored):
    """All quality results of one stage."""

    FILE: ClassVar[str] = "quality.json"

    tasks: dict[str, TaskQuality] = Field(default_factory=dict)
    perplexity: float | None = Field(default=None, description="Token perplexity on the local corpus.")
    scoring_s: float | None = Field(
        default=None, description="Wall time of the corpus scoring (perplexity, divergence).")
    divergence: Divergence | None = Field(
        default=None, description="Against the baseline; None for the baseline itself."
    )
    perplexity_vs_parent: PerplexityRatio | None = Field(
        default=None, description="Paired against the parent stage; None for the baseline."
    )
    perplexity_vs_baseline: PerplexityRatio | None = Field(
        default=None, description="Paired against the baseline; None for the baseline itself."
    )
    paired_tokens: PairedTokens | None = Field(
        default=None, description="Per-token KL, top-1 and NLL differences the gates resample."
    )
    looks: int = Field(default=1, description="Looks of the sequential accuracy test taken.")
    added_items: dict[str, int] = Field(
        default_factory=dict, description="Items scored after the first look (adaptive), per set."
    )
    added_s: float = Field(default=0.0, description="Seconds spent scoring those items.")
    look_sizes: list[dict[str, int]] = Field(
        default_factory=list, description="Items per set at each earlier look, in order: a rule "
        "that one of them decided stays decided (group-sequential), so the gates judge each look "
        "on its own prefix of the items."
    )
    reach: dict[str, int] = Field(
        default_factory=dict, description="Items each set ('math') and each group of a set "
        "('long_context.4k') can reach by the last look: a set or group is held to the loss that "
        "many items resolve, at every look (gates.accuracy.own_margin); absent, the items it has."
    )
    own_sizes: dict[str, int] | None = Field(
        default=None, description="Items per set this stage's own looks ended with, where a later "
        "stage had it answer more as its parent served again (None: every item is its own): "
        "those pair with that stage only and do not re-judge this one."
    )

    def save(self, folder: Path) -> Path:
        """quality.json, and each set's items one per line beside it (for people and pandas:
        the record is quality.json)."""
        path = super().save(folder)
        for name, task in self.tasks.items():
            with (folder / f"samples_{name}.jsonl").open("w") as out:
                for item in task.items:
                    out.write(json.dumps(item.model_dump()) + "\n")
        return path


class MoreItems(Stored):
    """Items a stage answered after its own stage, for a later stage's adaptive looks: the
    baseline beside each later stage, a parent served again beside its child. A record of its
    own in `<stage>/more/` (with lm-eval's raw results), so the stage's quality.json stays as its
    own stage measured it; readers of the stage (gates.record) pair the later stages on both and
    judge the stage itself on its own items."""

    FILE: ClassVar[str] = "more_items.json"
    FOLDER: ClassVar[str] = "more"

    tasks: dict[str, list[QualityItem]] = Field(
        default_factory=dict, description="Per set, the items answered after the stage, in order.")
    asked_by: dict[str, list[str]] = Field(
        default_factory=dict, description="Per set, the stages whose looks asked for them.")

    @classmethod
    def kept(cls, stage_folder: Path) -> MoreItems | None:
        """The stage's more items, None when no later stage asked any."""
        folder = stage_folder / cls.FOLDER
        return cls.read(folder) if (folder / cls.FILE).is_file() else None

    def add(self, set_name: str, items: list[QualityItem], asked_by: str) -> None:
        known = {item.id for item in self.tasks.get(set_name, [])}
        self.tasks.setdefault(set_name, []).extend(i for i in items if i.id not in known)
        if asked_by not in self.asked_by.setdefault(set_name, []):
            self.asked_by[set_name].append(asked_by)

    def keep(self, stage_folder: Path) -> Path:
        return self.save(stage_folder / self.FOLDER)
