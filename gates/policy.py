"""Gate policy: tolerances per rule and per stage kind (8-bit / 4-bit), from YAML into pydantic."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from infra.errors import SpecError, did_you_mean
from infra.values import MAX_RESAMPLES, at_most
from infra.yamlfile import read_mapping, validate_model

DEFAULT_POLICY = Path(__file__).with_name("policy.yaml")

Precision = Literal["8bit", "4bit"]
_BITS = re.compile(r"(?:u?int|float|fp)(\d+)")


LATENCY_LEVELS = ("low", "high")  # the two levels of every load profile (LoadProfile.levels)
# A relative increase above this (x11) lets every regression through: it switches the rule off.
MAX_RELATIVE_INCREASE = 10
# Resamples x pooled items one bootstrap holds at once: 4 GiB (an int64 index and a float64 each).
MAX_RESAMPLED_VALUES = 250_000_000
# Limits past which a rule passes whatever a stage does: finite, yet a rule switched off unseen
# (a rule is relaxed by its own setting: `required: false`, `finish_required: false`).
MAX_MARGIN = 0.5  # accuracy points a stage may lose: half of them is already no gate
MAX_KL = 1.0  # nats per token: a stage a whole nat away from the baseline is another model
MIN_TOP1 = 0.5  # below half the tokens agreeing, the stage answers as another model does
MAX_SHARE = 0.5  # of requests failing, of answers changing length, of answers cut off
MIN_RESAMPLES = 200


def _off_above(limit: float, what: str) -> object:
    return at_most(limit, "", f"{what}: a larger one passes whatever a stage does, which switches "
                   "the rule off unseen")


RelativeIncrease = Annotated[float, at_most(
    MAX_RELATIVE_INCREASE, "", "a larger allowance (over x11) lets every regression through, "
    "which switches the rule off unseen")]


class Rules(BaseModel):
    # A limit of .inf or .nan switches its rule off unseen; a rule is relaxed by saying so.
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class Tolerance(Rules):
    """What a stage of one precision class may cost, against the baseline."""

    accuracy_margin: Annotated[float, _off_above(MAX_MARGIN, "half the points")] = Field(
        gt=0, description="Non-inferiority margin: accuracy points a stage may lose vs the "
        "baseline (0.08 = 8 points), pooled over the sets."
    )
    max_kl: Annotated[float, _off_above(MAX_KL, "a nat per token")] = Field(
        gt=0, description="Mean per-token KL(baseline || stage), nats (at most 1).")
    min_top1: float = Field(ge=MIN_TOP1, le=1, description="Share of tokens with the same top-1 "
                            "token (at least 0.5: below it the rule passes another model).")


class QualityRules(Rules):
    confidence: float = Field(0.95, gt=0.5, lt=1, description="Two-sided CI level of every bound.")
    alpha: Annotated[float, at_most(0.2, "", "a test that says go on one run in five of a stage "
                                    "at the margin is no test")] = Field(
        0.05, gt=0, description="One-sided exact McNemar level (Holm).")
    power: float = Field(
        0.80, gt=0.5, lt=1, description="Power the pooled accuracy test must reach at the margin "
        "for an equivalent stage (validate refuses a spec below it)."
    )
    planning_discordance: float = Field(
        0.10, gt=0, le=1, description="Share of items expected to flip, for the power check."
    )
    planning_cluster_rho: float = Field(
        0.3, ge=0, lt=1, description="For the power check of a set that declares clusters: the "
        "share of a cluster's items that are right, wrong and flip together (the simulation's "
        "cluster_rho; 0.3 gives a design effect of about 1.6 at 20 items per cluster)."
    )
    min_items: int = Field(
        20, ge=1, le=100_000, description="Fewer paired items fail closed (validate refuses a "
        "spec whose sets cannot reach it: flows/preflight.py Prepared, check_min_items).")
    max_looks: int = Field(
        3, ge=1, le=10, description="Looks of the sequential accuracy test: the first, then one per "
        "batch of extra items scored while it is inconclusive; alpha is split over them."
    )
    growth: float = Field(
        2.0, gt=1, le=10, description="Each extra batch multiplies a set's item count by this "
        "(capped by the items the set has)."
    )
    set_margin_factor: float = Field(
        2.0, ge=1, le=10, description="Each set on its own must be non-inferior at this multiple "
        "of the pooled margin (its own items resolve only a larger loss)."
    )
    group_margin_factor: float = Field(
        2.5, ge=1, le=20, description="Each group of a set (a long-context length bucket) at this "
        "multiple of the pooled margin, for stages serving a quantized KV cache."
    )
    size_margin_z: float = Field(
        7.0, ge=0, le=100, description="A set or group that can reach n items (effective pairs) "
        "by the last look is held, at every look, to size_margin_z x sqrt(planning_discordance / "
        "n), within [the pooled margin, its factor x the margin]: the loss its own items resolve, "
        "so the factor holds a small set and a large one is held to the pooled margin (0: every "
        "set and group at the pooled margin)."
    )
    max_error_ratio: float = Field(
        2.5, gt=1, le=100, description="A set's own margin never lets the stage "
        "make more than this many times the baseline's errors (near the ceiling) or keep less "
        "than 1/this of its right answers (near the floor): the scale that still resolves there."
    )
    long_context_required: bool = Field(
        False, description="Groups are judged (and block when unresolved) for every stage, not "
        "only for stages that serve a quantized KV cache."
    )
    bootstrap_resamples: Annotated[int, at_most(
        MAX_RESAMPLES, "", "the Monte Carlo error is already far below any margin, and each "
        "resample holds a copy of the per-token values in memory")] = Field(
        2000, ge=MIN_RESAMPLES, description="Paired bootstrap resamples.")
    seed: int = Field(20240917, ge=0, description="Bootstrap seed (numpy takes no negative one): "
                      "the same records give the same verdict.")


class DivergenceRules(Rules):
    required: bool = Field(True, description="Missing or inconclusive KL / top-1 blocks the go.")
    block_tokens: int = Field(
        64, ge=1, description="Consecutive positions (within one text) resampled together by the "
        "block bootstrap of KL, top-1 agreement and the perplexity ratios."
    )
    min_blocks: int = Field(
        30, ge=2, description="A scoring corpus of fewer blocks of block_tokens cannot decide: "
        "KL, top-1 and perplexity are inconclusive (a rollback when required). One block has no "
        "spread to resample, and under ~30 the interval of a heavy-tailed mean falls below it "
        "more often than its level allows (python -m tools.benchmarks.divergence)."
    )
    corpus_tokens: int = Field(
        24_000, ge=2_000, description="Scored tokens of the scoring corpus at most: each set "
        "gives an equal share of its items, in order (a set that needs less leaves the rest to "
        "the others), the prose always in. Prompt logprobs cost every stage about 1 ms a token "
        "on 2 CPU cores, whatever the set sizes; the KL's interval holds its level at any size "
        "of at least min_blocks blocks, and narrows as it grows."
    )

    @model_validator(mode="after")
    def _corpus_holds_min_blocks(self) -> DivergenceRules:
        least = self.min_blocks * self.block_tokens
        if self.corpus_tokens < least:
            raise ValueError(f"corpus_tokens {self.corpus_tokens:,} cannot hold min_blocks "
                             f"{self.min_blocks} blocks of block_tokens {self.block_tokens} "
                             f"({least:,} tokens): no corpus that size could decide")
        return self


class PerplexityRules(Rules):
    max_increase_vs_parent: RelativeIncrease = Field(
        0.05, ge=0, description="Relative increase allowed.")
    max_increase_vs_baseline: RelativeIncrease = Field(
        0.10, ge=0, description="Relative increase allowed.")


class LatencyRules(Rules):
    level: Literal["low", "high"] = Field("low", description="Which load level judges latency.")
    max_tpot_p50_increase: RelativeIncrease = Field(
        0.25, ge=0, description="Relative, vs the reference (parent, or nearest served ancestor)."
    )
    max_ttft_p50_increase: RelativeIncrease = Field(
        0.50, ge=0, description="Relative, vs the reference (parent, or nearest served ancestor)."
    )
    max_tpot_p50_increase_vs_baseline: RelativeIncrease = Field(
        0.25, ge=0, description="Relative, summed over the chain of timed steps to the baseline."
    )
    max_ttft_p50_increase_vs_baseline: RelativeIncrease = Field(
        0.50, ge=0, description="Relative, summed over the chain of timed steps to the baseline."
    )
    required: bool = Field(
        False, description="A regression that the measured noise cannot resolve blocks the go."
    )
    max_rounds: int = Field(
        48, ge=3, le=96, description="When latency is required, a timed stage whose step is "
        "unresolved gets more interleaved rounds at the judged level: it is judged at 3, 6, 12, "
        "... rounds up to this many, alpha split over those looks."
    )
    max_other_cpu_share: float = Field(
        0.10, gt=0, le=1, description="A timed stage whose rounds saw processes outside the run "
        "take more of the box's CPU than this (infra.contention) is contended: its latency is "
        "inconclusive, neither a pass nor a fail."
    )

    @field_validator("level", mode="before")
    @classmethod
    def _known_level(cls, value: object) -> object:
        if value not in LATENCY_LEVELS:
            raise ValueError(f"level {value!r}: {did_you_mean(str(value), LATENCY_LEVELS)}")
        return value


class LoadRules(Rules):
    max_error_rate: Annotated[float, _off_above(MAX_SHARE, "half the requests")] = Field(
        0.01, ge=0, description="Per level.")


class LengthRules(Rules):
    max_change: Annotated[float, _off_above(MAX_SHARE, "x0.5 to x1.5")] = Field(
        0.10, gt=0, description="Per set and pooled, the CI of the paired mean length "
        "ratio vs the parent stays within 1 ± this."
    )
    max_change_vs_baseline: Annotated[float, _off_above(MAX_SHARE, "x0.5 to x1.5")] = Field(
        0.10, gt=0, description="The same vs the baseline: the chain as a whole gets one "
        "step's allowance."
    )
    max_censored_share: float = Field(
        0.5, gt=0, lt=1, description="A set with confidently more of one side's answers cut at "
        "the budget than this (the share's Wilson lower bound above it) cannot pass (its ratio "
        "would rest on the censored tail)."
    )
    required: bool = Field(True, description="An inconclusive length CI blocks the go.")
    max_length_finish_increase: Annotated[float, _off_above(MAX_SHARE, "half the answers")] = Field(
        0.05, ge=0, description="Rise in the share of responses cut off (finish=length); also "
        "the most that may have run past the budget for a mostly cut set to be read within it."
    )
    finish_required: bool = Field(False, description="An inconclusive finish=length rise blocks.")

    @property
    def log_bounds(self) -> tuple[float, float]:
        return math.log(1 - self.max_change), math.log(1 + self.max_change)

    @property
    def log_bounds_vs_baseline(self) -> tuple[float, float]:
        return math.log(1 - self.max_change_vs_baseline), math.log(1 + self.max_change_vs_baseline)


def _default_tolerances() -> dict[str, Tolerance]:
    return {
        "8bit": Tolerance(accuracy_margin=0.08, max_kl=0.03, min_top1=0.90),
        "4bit": Tolerance(accuracy_margin=0.10, max_kl=0.10, min_top1=0.84),
    }


class GatePolicy(Rules):
    tolerances: dict[Precision, Tolerance] = Field(default_factory=_default_tolerances)
    quality: QualityRules = Field(default_factory=QualityRules)
    divergence: DivergenceRules = Field(default_factory=DivergenceRules)
    perplexity: PerplexityRules = Field(default_factory=PerplexityRules)
    latency: LatencyRules = Field(default_factory=LatencyRules)
    load: LoadRules = Field(default_factory=LoadRules)
    length: LengthRules = Field(default_factory=LengthRules)
    rules: dict[str, dict[str, Any]] = Field(
        default_factory=dict, exclude_if=lambda sections: not sections,  # a policy without
        # plug-ins dumps (and hashes) as it did before they existed
        description="Settings of rules added as plug-ins (gates/rules/), "
        "by rule name; each is validated by its rule's own model.")

    def reachable(self, items: int, pool: int) -> int:
        """Items a set of `items` can grow to by the last look, within its `pool`."""
        return min(pool, math.ceil(items * self.quality.growth ** (self.quality.max_looks - 1)))

    def check_min_items(self, pools: dict[str, int], source: str) -> None:
        """Refuse a policy the spec's eval sets make unusable (their sizes are known only with
        the spec, at validate): quality.min_items more than a set holds (that set would fail
        closed at every stage), or more bootstrap values than the box can hold."""
        short = {name: pool for name, pool in pools.items() if pool < self.quality.min_items}
        if short:
            sets = ", ".join(f"{name!r} ({pool} items)" for name, pool in sorted(short.items()))
            raise SpecError(
                f"gate policy {source}: quality.min_items ({self.quality.min_items}) is more than "
                f"eval set {sets} holds: every stage would fail closed on it; lower "
                "quality.min_items or use larger sets")
        self._check_resampled_values(sum(pools.values()), source)

    def _check_resampled_values(self, items: int, source: str) -> None:
        """The item-level bootstraps (accuracy recovery, length finish) draw every resample of
        the pooled items at once: resamples x items values (an index and a number each)."""
        resamples = self.quality.bootstrap_resamples
        if resamples * items <= MAX_RESAMPLED_VALUES:
            return
        fits = MAX_RESAMPLED_VALUES // items
        fix = (f"lower quality.bootstrap_resamples to at most {fits:,}" if fits >= MIN_RESAMPLES
               else f"give the eval sets a limit: even {MIN_RESAMPLES} resamples (the fewest) "
               f"fit at most {MAX_RESAMPLED_VALUES // MIN_RESAMPLES:,} items")
        raise SpecError(
            f"gate policy {source}: quality.bootstrap_resamples ({resamples:,}) x {items:,} pooled "
            f"eval items = {resamples * items:,} resampled values, over {MAX_RESAMPLED_VALUES:,} "
            f"(about {resamples * items * 16 / 2**30:,.0f} GiB at once); {fix}")

    def tolerance(self, precision: Precision) -> Tolerance:
        if precision not in self.tolerances:
            raise SpecError(
                f"gate policy has no tolerances for {precision!r} stages; "
                f"it has: {', '.join(self.tolerances) or 'none'}"
            )
        return self.tolerances[precision]


def axis_bits(value: str) -> int | None:
    """'int4/group64' -> 4, 'fp8_e4m3' -> 8, 'none' / 'auto' -> None."""
    widths = [int(bits) for bits in _BITS.findall(value)]
    return min(widths) if widths else None


def precision_class(axes: dict[str, str]) -> Precision:
    """A stage is held to the tolerance of its narrowest quantized axis (cumulative config).

    An unquantized stage (the baseline, an A/A replica) gets the strict 8-bit tolerance.
    """
    widths = [bits for bits in (axis_bits(v) for v in axes.values()) if bits is not None]
    return "4bit" if widths and min(widths) <= 4 else "8bit"


RUN_POLICY_FILE = "policy.json"


def save_run_policy(policy: GatePolicy, results_dir: Path) -> Path:
    """The policy a run is judged by, kept with its results so a re-gate uses the same one."""
    results_dir.mkdir(parents=True, exist_ok=True)
    path = results_dir / RUN_POLICY_FILE
    path.write_text(policy.model_dump_json(indent=1))
    return path


def run_policy(results_dir: Path) -> tuple[GatePolicy, str] | None:
    """The policy stored with a run (policy.json, else the one in verdict.json) and its file."""
    import json

    for name, pick in ((RUN_POLICY_FILE, lambda data: data), ("verdict.json",
                                                             lambda data: data.get("policy"))):
        path = results_dir / name
        if not path.is_file():
            continue
        try:
            data = pick(json.loads(path.read_text()))
        except ValueError as exc:
            raise SpecError(f"stored gate policy {path} is unreadable: {exc}") from exc
        if data:
            try:
                return GatePolicy.model_validate(data), str(path)
            except ValueError as exc:
                raise SpecError(f"stored gate policy {path} is invalid: {exc}") from exc
    return None


def load_policy(name_or_path: str, base_dir: Path | None = None) -> GatePolicy:
    """'default' is gates/policy.yaml; anything else is a path (relative to base_dir).

    A policy file may start from another one and name only what it changes: `extends: default`
    (or a path, relative to the file), then the keys it sets. Mappings merge key by key (a
    tolerance class, a section); any other value replaces the base's."""
    data, source = _policy_data(name_or_path, base_dir, ())
    return validate_model(data, GatePolicy, source)


def _policy_data(name_or_path: str, base_dir: Path | None, seen: tuple[Path, ...]
                 ) -> tuple[dict, str]:
    if name_or_path == "default":
        path = DEFAULT_POLICY
    else:
        path = Path(name_or_path)
        if not path.is_absolute() and base_dir is not None:
            path = base_dir / path
        if not path.is_file():
            raise SpecError(f"gate policy {name_or_path!r} not found (looked at {path}); "
                            "use 'default'")
    if path.resolve() in seen:
        chain = " -> ".join(str(p) for p in (*seen, path.resolve()))
        raise SpecError(f"gate policy {path}: `extends` goes round in a circle ({chain})")
    data = read_mapping(path)
    base = data.pop("extends", None)
    if base is None:
        return data, str(path)
    if not isinstance(base, str):
        raise SpecError(f"gate policy {path}: `extends` names a policy ('default' or a path), "
                        f"got {base!r}")
    merged, _ = _policy_data(base, path.parent, (*seen, path.resolve()))
    return _merged(merged, data), str(path)


def _merged(base: dict, changes: dict) -> dict:
    out = dict(base)
    for key, value in changes.items():
        out[key] = (_merged(out[key], value) if isinstance(value, dict)
                    and isinstance(out.get(key), dict) else value)
    return out
