"""Sampled sets for reasoning models: k samples per item, the item's score their mean.

Reasoning models (Qwen3, DeepSeek-R1 distills, gpt-oss) are evaluated by their makers with
sampling (temperature 0.6, top-p 0.95) and several samples per item, and greedy decoding says
little about them. A set with `sampling` asks every item `samples` times; the settings the spec
leaves out come from the baseline checkpoint's `generation_config.json` (the maker's), so every
stage samples alike. Sample j of every item carries the seed `seed + j` on every stage (vLLM's
per-request seed): the stages draw with the same random numbers, so an equivalent stage's
samples mostly follow the baseline's and the pairing keeps its power (common random numbers).

The item stays the unit of pairing: its k samples are k paired sub-items of one cluster
(gates.accuracy), so their correlation widens the interval by its design effect and never
counts as k independent items. Greedy stays the default.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from evalsets.results import QualityItem, TaskQuality

# What a checkpoint without a generation_config.json (or without these keys) samples with:
# transformers' GenerationConfig defaults, which vLLM also applies (top_k off).
UNSET_DEFAULTS = {"temperature": 1.0, "top_p": 1.0, "top_k": 0}
GENERATION_CONFIG = "generation_config.json"


class Sampling(BaseModel):
    """How a set is sampled, as written in the spec (`evalsets: [{name, sampling: {...}}]`)."""

    model_config = {"extra": "forbid"}

    samples: int = Field(default=4, ge=2, le=64, description="Samples per item (k); the item's "
                         "score is their mean, its k samples one cluster of the paired test.")
    temperature: float | None = Field(default=None, gt=0, le=5, description="Default: the "
                                      "baseline's generation_config.json, else 1.0.")
    top_p: float | None = Field(default=None, gt=0, le=1, description="Default: the baseline's "
                                "generation_config.json, else 1.0.")
    top_k: int | None = Field(default=None, ge=0, description="0: off. Default: the baseline's "
                              "generation_config.json, else off.")
    seed: int = Field(default=0, ge=0, description="Sample j of every item is asked with seed "
                      "seed + j, on every stage alike.")

    def resolved(self, checkpoint: Path) -> Sampling:
        """The settings left out, from the checkpoint's generation_config.json (or the defaults
        transformers and vLLM use without one), so every stage is asked the same way."""
        maker = maker_settings(checkpoint)
        filled = {key: getattr(self, key) if getattr(self, key) is not None
                  else maker.get(key, UNSET_DEFAULTS[key]) for key in UNSET_DEFAULTS}
        return self.model_copy(update=filled)

    def generation_kwargs(self) -> dict[str, Any]:
        """What every request of the set sends (lm-eval passes unknown keys to the server)."""
        # Unresolved (a set read without its spec): what the server would sample with.
        value = {key: getattr(self, key) if getattr(self, key) is not None else default
                 for key, default in UNSET_DEFAULTS.items()}
        settings = {"do_sample": True, "temperature": value["temperature"],
                    "top_p": value["top_p"], "samples": self.samples, "seed": self.seed}
        return settings | ({"top_k": value["top_k"]} if value["top_k"] else {})

    def seeds(self) -> list[int]:
        return [self.seed + j for j in range(self.samples)]


def maker_settings(checkpoint: Path) -> dict[str, Any]:
    """temperature, top_p and top_k from the checkpoint's generation_config.json, where given."""
    path = checkpoint / GENERATION_CONFIG
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(config, dict):
        return {}
    return {key: config[key] for key in UNSET_DEFAULTS
            if isinstance(config.get(key), int | float) and not isinstance(config.get(key), bool)}


def request_kwargs(generation: dict[str, Any], seed: int) -> dict[str, Any]:
    """One sample's generation kwargs: the set's, with the sample's own seed in place of the
    set's first one, without quantgate's own `samples`."""
    return {key: value for key, value in generation.items() if key != "samples"} | {"seed": seed}


def combined(runs: list[TaskQuality]) -> TaskQuality:
    """One set's k sampled runs as one: per item (in the first run's order) the mean score and
    the per-sample scores, the mean lengths, the first sample's response; an item cut at the
    budget in any sample counts as cut (its length is then a lower bound)."""
    first = runs[0]
    by_id = [{item.id: item for item in run.items} for run in runs]
    items = []
    for item in first.items:
        answers = [run[item.id] for run in by_id if item.id in run]
        if len(answers) != len(runs):
            continue  # an item some sample lacks cannot be paired on its mean
        items.append(item.model_copy(update={
            "score": sum(a.score for a in answers) / len(answers),
            "samples": [a.score for a in answers],
            "output_tokens": _mean(a.output_tokens for a in answers),
            "reasoning_tokens": _mean(a.reasoning_tokens for a in answers),
            "finish_reason": "length" if any(a.finish_reason == "length" for a in answers)
            else item.finish_reason,
        }))
    return TaskQuality(task=first.task, metric=first.metric, items=items,
                       value=sum(i.score for i in items) / len(items) if items else 0.0)


def _mean(values) -> int | None:
    known = [v for v in values if v is not None]
    return round(sum(known) / len(known)) if known else None


def sub_items(item: QualityItem) -> list[QualityItem]:
    """A sampled item as its samples, each a binary sub-item of the item's cluster (its declared
    one, else the item itself); an item without samples is itself."""
    if not item.samples:
        return [item]
    cluster = item.cluster if item.cluster is not None else f"item:{item.id}"
    return [item.model_copy(update={"id": f"{item.id}#{j}", "score": score, "samples": None,
                                    "cluster": cluster})
            for j, score in enumerate(item.samples)]
