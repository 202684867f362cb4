"""Simulated stage records shaped like the real sets, for the decision benchmark and validate's power.

What real records carry and a naive simulation leaves out, each drawn here:

- groups (the long-context length buckets, a user set's `group` field), each with its own baseline
  accuracy, interleaved in the data as the real generators order them (so any first N items mix
  them);
- clusters of near-duplicate items (the generated sets' templates): items of one cluster share
  their random draws with probability `cluster_rho`, so they are right, wrong and flip together;
- sets near the floor or the ceiling;
- answer lengths with a budget: a stage whose answers grow is cut at the set's `budget` (finish
  "length"), so the recorded length is a lower bound of the true one;
- per-token KL with heavy tails and block correlation (a per-block scale times a mixture of small
  and lognormal-heavy values), top-1 agreement and NLL differences on the same positions;
- chains: each stage is drawn from its parent with the step's own change;
- sampled sets (k samples per item, evalsets.sampling): an answer per item and sample, the k
  samples of an item sharing their draws with probability `sample_rho` (an item is easy or hard
  for every sample), flips drawn per sample as the same seed on both sides leaves them.

The drop a scenario names is the drop simulated: per item, P(right -> wrong) and P(wrong -> right)
are solved from the parent's realised accuracy so that their difference is the drop exactly (in
expectation over the pool) and their sum the discordance; where the discordance cannot hold the
drop it is raised, never the drop clipped.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import brentq

from evalsets.results import Divergence, PairedTokens, QualityItem, QualityResult, TaskQuality


@dataclass(frozen=True)
class SetShape:
    """One eval set: first-look items, pool, baseline accuracy per group, lengths, clusters."""

    name: str
    first: int
    pool: int
    accuracy: dict[str, float]  # group -> baseline accuracy; one group "" for an ungrouped set
    tokens: float = 60.0  # median answer length
    budget: int = 256  # generation budget: longer answers are cut here (finish "length")
    cluster_size: int = 1
    cluster_rho: float = 0.0
    # Each pool item's cluster as read from the set's data (validate: the contract's cluster
    # field, in data order); empty: clusters of `cluster_size`, spread as templates cycle.
    clusters: tuple[int, ...] = ()
    samples: int = 1  # per item (a sampled set): answers are then (pool, samples)
    sample_rho: float = 0.5

    @property
    def groups(self) -> list[str]:
        return list(self.accuracy)

    def group_of(self, index: int) -> str:
        return self.groups[index % len(self.groups)]  # interleaved, as the generators write them

    @property
    def clustered(self) -> bool:
        return self.cluster_size > 1 or bool(self.clusters)

    def cluster_of(self, index: int) -> int:
        if self.clusters:
            return self.clusters[index]
        # Near-duplicates sit apart in the data (templates cycle), within one group.
        span = len(self.groups) * max(1, self.pool // (len(self.groups) * self.cluster_size))
        return index % span if self.cluster_size > 1 else index

    @functools.cached_property
    def group_labels(self) -> np.ndarray:
        """Each pool item's group, computed once (every trial and stage reads it)."""
        return np.array([self.group_of(i) for i in range(self.pool)])

    @functools.cached_property
    def cluster_labels(self) -> np.ndarray:
        return np.array([self.cluster_of(i) for i in range(self.pool)])


# The demo's sets at the sizes the demo runs: first look, pool, and the baseline accuracies the
# real demo measured (long context per bucket: short contexts near the ceiling, 4k far lower;
# business per task group: classify at the floor, extract 62 %, json 15 %; a set-wide drop is
# spread over the groups that can take it, `spread`, so "business loses 8 points" loses 8).
DEMO_SETS = (
    SetShape("math", 60, 1040, {"": 0.217}, tokens=70, budget=256),
    SetShape("business", 40, 300, {"classify": 0.02, "extract": 0.62, "json": 0.15},
             tokens=90, budget=256),
    SetShape("code", 20, 160, {"": 0.85}, tokens=120, budget=384),
    SetShape("long_context", 40, 480, {"512": 0.95, "1k": 0.85, "2k": 0.75, "4k": 0.55},
             tokens=12, budget=32),
)


@dataclass
class Step:
    """What is true of one stage against its parent (drops are cumulative against the baseline)."""

    drop: dict[str, float] = field(default_factory=dict)  # set or "set.group" (or "*") -> points
    length: dict[str, float] = field(default_factory=dict)  # set (or "*") -> true length ratio
    kl: float = 0.3  # true mean KL vs the baseline, as a multiple of the policy's limit
    top1: float = 0.97  # true top-1 agreement vs the baseline
    tpot_increase: float = 0.0  # true, cumulative vs the baseline


def _correlated_uniforms(rng: np.random.Generator, shape: SetShape) -> np.ndarray:
    """One uniform per pool item (per item and sample: (pool, samples)); items of a cluster share
    their cluster's with P(cluster_rho), samples of an item the item's with P(sample_rho)."""
    if shape.samples > 1:
        own = rng.random((shape.pool, shape.samples))
        item = np.repeat(rng.random(shape.pool)[:, None], shape.samples, axis=1)
        own = np.where(rng.random(own.shape) < shape.sample_rho, item, own)
    else:
        own = rng.random(shape.pool)
    if not shape.clustered or shape.cluster_rho <= 0:
        return own
    clusters = shape.cluster_labels
    shared = rng.random(clusters.max() + 1)[clusters]
    if own.ndim == 2:
        shared = np.repeat(shared[:, None], shape.samples, axis=1)
    return np.where(rng.random(own.shape) < shape.cluster_rho, shared, own)


def baseline_answers(rng: np.random.Generator, shape: SetShape) -> np.ndarray:
    accuracy = np.vectorize(shape.accuracy.__getitem__, otypes=[float])(shape.group_labels)
    uniforms = _correlated_uniforms(rng, shape)
    return uniforms < (accuracy[:, None] if uniforms.ndim == 2 else accuracy)


def _flip_rates(accuracy: float, drop: float, discordance: float) -> tuple[float, float]:
    """P(right -> wrong), P(wrong -> right) with accuracy * p_break - (1 - accuracy) * p_fix = drop."""
    # A group's realized accuracy bounds what it can change by: a perfect one cannot gain.
    drop = min(max(drop, accuracy - 1), accuracy)
    discordance = max(discordance, abs(drop))
    # A set (or group) with no wrong answers has nothing to fix: its flips can only be breaks,
    # so it takes the ceiling's branch below (breaks are the drop alone), not half the
    # discordance as breaks (a 7.5-point loss labelled "equivalent"); the floor likewise.
    p_break = (discordance + drop) / (2 * accuracy) if accuracy > 0 else math.inf
    p_fix = (discordance - drop) / (2 * (1 - accuracy)) if accuracy < 1 else math.inf
    if p_fix > 1:  # near the ceiling: every wrong answer is fixed; breaks make up the rest
        p_fix, p_break = 1.0, (drop + (1 - accuracy)) / accuracy
    if p_break > 1:
        p_break, p_fix = 1.0, (accuracy - drop) / (1 - accuracy)
    if not (0 <= p_break <= 1 and 0 <= p_fix <= 1):
        raise ValueError(f"a {drop:+.3f} change cannot be drawn at accuracy {accuracy:.3f}")
    return p_break, p_fix


def stage_answers(rng: np.random.Generator, shape: SetShape, parent: np.ndarray,
                  drop: dict[str, float], before: dict[str, float],
                  discordance: float) -> np.ndarray:
    """A stage's answers drawn from its parent's, each group losing its step's share of the drop:
    a group named in `drop` its own, the others the set's step spread over them (`spread`)."""
    out = parent.copy()
    draws = _correlated_uniforms(rng, shape)
    members = {group: shape.group_labels == group for group in shape.groups}
    accuracy = {group: float(parent[m].mean()) for group, m in members.items()}
    steps = {}
    for group in shape.groups:
        key = f"{shape.name}.{group}"
        if group and (key in drop or key in before):
            steps[group] = _lookup(drop, key, shape.name) - _lookup(before, key, shape.name)
    shared = [group for group in shape.groups if group not in steps]
    if shared:
        set_step = _lookup(drop, shape.name, shape.name) - _lookup(before, shape.name, shape.name)
        weights = np.array([members[g].sum() for g in shared], dtype=float)
        steps |= dict(zip(shared, spread(set_step, weights / weights.sum(),
                                         np.array([accuracy[g] for g in shared])), strict=True))
    for group, m in members.items():
        p_break, p_fix = _flip_rates(accuracy[group], steps[group], discordance)
        out[m] = np.where(parent[m], draws[m] >= p_break, draws[m] < p_fix)
    return out


def spread(step: float, weights: np.ndarray, accuracies: np.ndarray) -> np.ndarray:
    """Per-group drops whose weighted mean is `step`: the same drop in every group, except that no
    group loses more than its accuracy or gains more than its errors (a group at the floor cannot
    lose its share, so the others take it; as much as the groups can take, in all)."""
    def taken(common: float) -> np.ndarray:
        return np.clip(common, accuracies - 1, accuracies)

    low, high = float(np.min(accuracies - 1)), float(np.max(accuracies))
    if step <= weights @ taken(low) or step >= weights @ taken(high):
        return taken(low if step <= weights @ taken(low) else high)
    return taken(brentq(lambda common: weights @ taken(common) - step, low, high))


def _lookup(table: dict[str, float], key: str, set_name: str) -> float:
    for name in (key, set_name, "*"):
        if name in table:
            return table[name]
    return 0.0


# How a changed answer's log length follows the one it replaces (see stage_lengths).
RHO = 0.4


def baseline_lengths(rng: np.random.Generator, shape: SetShape) -> np.ndarray:
    """True (uncut) answer lengths of the baseline, lognormal around the set's median."""
    return np.maximum(1.0, shape.tokens * rng.lognormal(0.0, 0.5, shape.pool))


def stage_lengths(rng: np.random.Generator, parent_true: np.ndarray, ratio: float,
                  changed_share: float = 0.5) -> np.ndarray:
    """True lengths of a stage: about half its answers change (greedy decoding on a perturbed
    model), and a changed answer is another answer: its log length is drawn anew from the
    parent's law (the pool's mean and spread of log lengths), correlated RHO with the parent's
    own, and shifted so that the mean log ratio over all answers is log(ratio) exactly. So the
    stage's lengths are the parent's law scaled, as the real stages showed (cut at the budget
    about as often as their reference: 33 vs 36 of 400 math answers, 43 vs 41 % on HumanEval).
    RHO 0.4 gives a changed pair's log ratio the spread 0.5 x sqrt(2 x 0.6) = 0.55 that the real
    W8A16 stage showed against the bf16 baseline on SmolLM2's math answers (76 of 142 changed)."""
    changed = rng.random(parent_true.size) < changed_share
    shift = math.log(ratio) / changed_share
    logs = np.log(parent_true)
    centre, spread = logs.mean(), logs.std()
    drawn = (centre + RHO * (logs - centre)
             + math.sqrt(1 - RHO**2) * spread * rng.standard_normal(parent_true.size))
    return np.maximum(1.0, np.where(changed, np.exp(drawn + shift), parent_true))


def grown_order(shape: SetShape, order: np.ndarray, size: int,
                groups: dict[str, int] | None) -> np.ndarray:
    """The pool items a stage has after a look, in the order it scored them: `order` and then
    the new ones, either the set's first `size` items or (`groups`) each group's first items."""
    if groups is None:
        wanted = np.arange(size)
    else:
        wanted = np.concatenate([np.flatnonzero(shape.group_labels == group)[:n]
                                 for group, n in groups.items()])
    new = np.setdiff1d(wanted, order)  # sorted: pool order
    return np.concatenate([order, new]).astype(int)


class PoolItems:
    """Each pool item of one set as one stage answered it, built when a look first takes it
    (the looks of a stage take the same items again; nothing downstream changes an item)."""

    def __init__(self, shape: SetShape, answers: np.ndarray, lengths: np.ndarray):
        self.shape, self.answers, self.lengths = shape, answers, lengths
        self.built: dict[int, QualityItem] = {}

    def take(self, index: list[int]) -> list[QualityItem]:
        new = [i for i in dict.fromkeys(index) if i not in self.built]
        if new:
            self.built.update(zip(new, self._build(np.array(new, dtype=int)), strict=True))
        return [self.built[i] for i in index]

    def _build(self, index: np.ndarray) -> list[QualityItem]:
        shape, right, true_length = self.shape, self.answers[index], self.lengths[index]
        n = len(index)
        # Built unvalidated (model_construct): every field is drawn here with its declared
        # type, and a trial builds thousands of items.
        scores = (right.mean(axis=1) if right.ndim == 2 else right).astype(float).tolist()
        tokens_out = np.minimum(true_length, shape.budget).astype(int).tolist()
        cut = (true_length >= shape.budget).tolist()
        groups = shape.group_labels[index].tolist()
        clusters = (shape.cluster_labels[index].astype(str).tolist() if shape.clustered
                    else [None] * n)
        samples = right.astype(float).tolist() if right.ndim == 2 else [None] * n
        ids = index.tolist()
        return [QualityItem.model_construct(
            id=str(ids[i]), prompt_hash="h", response="", samples=samples[i], score=scores[i],
            output_tokens=tokens_out[i], finish_reason="length" if cut[i] else "stop",
            group=groups[i] or None, cluster=clusters[i], reasoning_tokens=None)
            for i in range(n)]


def quality(shapes: tuple[SetShape, ...], items: dict[str, PoolItems],
            sizes: dict[str, int], tokens: PairedTokens | None,
            order: dict[str, np.ndarray] | None = None) -> QualityResult:
    """A stage's quality record at `sizes` items per set (the first items of each pool), or at
    the pool items `order` names per set, in that order (a set grown by group); `items` are
    each set's pool items as the stage answered them."""
    tasks = {}
    for shape in shapes:
        index = (order or {}).get(shape.name)
        chosen = items[shape.name].take(
            list(range(sizes[shape.name])) if index is None else index.tolist())
        scores = [item.score for item in chosen]
        tasks[shape.name] = TaskQuality.model_construct(
            task=shape.name, metric="acc", items=chosen,
            value=float(np.mean(scores)) if scores else float("nan"))
    divergence = None if tokens is None else Divergence(
        tokens=tokens.tokens, mean_kl=float(tokens.values("kl").mean()),
        top1_agreement=float(tokens.values("top1_agree").mean()), top_k=20)
    return QualityResult(tasks=tasks, perplexity=10.0, divergence=divergence,
                         paired_tokens=tokens)


def corpus_spans(corpus_tokens: int) -> list[tuple[str, int]]:
    """Texts of the scoring corpus: answers, prompts and prose of mixed lengths (64..1,280)."""
    spans, left, index = [], corpus_tokens, 0
    lengths = (64, 180, 420, 1280, 96, 256)
    while left > 0:
        count = min(left, lengths[index % len(lengths)])
        spans.append((f"t{index}", count))
        left -= count
        index += 1
    return spans


def paired_tokens(rng: np.random.Generator, corpus_tokens: int, mean_kl: float, top1: float,
                  nll_shift: float, block_tokens: int = 64) -> PairedTokens:
    """Per-token KL with heavy tails and block correlation, mean exactly `mean_kl` in expectation.

    A block of consecutive positions shares a lognormal scale (sigma 0.6: one hard passage moves
    many tokens); within it 94 % of the tokens take small exponential values and 6 % lognormal
    heavy ones (sigma 1.5), which carry most of the mean, as real per-token KL does. Top-1
    disagreement follows the same block scale; NLL differences are noisy around log(1 + shift).
    """
    spans = corpus_spans(corpus_tokens)
    n = sum(count for _, count in spans)
    block_of = np.concatenate([np.arange(count) // block_tokens + 10_000 * i
                               for i, (_, count) in enumerate(spans)])
    _, block_index = np.unique(block_of, return_inverse=True)
    scale = rng.lognormal(-0.18, 0.6, block_index.max() + 1)[block_index]  # mean 1
    heavy = rng.random(n) < 0.06
    small = rng.exponential(1.0, n)
    large = rng.lognormal(0.0, 1.5, n) / math.exp(1.5**2 / 2)  # mean 1
    per_token = np.where(heavy, 12.0 * large, small)  # mean 0.06 * 12 + 0.94 = 1.66
    kl = mean_kl * scale * per_token / 1.66
    disagree = np.clip((1 - top1) * scale, 0, 1)
    agree = (rng.random(n) >= disagree).astype(int)
    nll = rng.normal(math.log1p(nll_shift), 0.35, n) * np.sqrt(scale)
    return PairedTokens.from_values(20, spans, kl=kl, top1_agree=agree,
                                    nll_diff_vs_baseline=nll, nll_diff_vs_parent=nll)
