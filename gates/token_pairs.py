"""A stage paired token by token with the baseline and its parent, from their stored top-k logprobs.

Measuring (evalsets) stores each stage's own per-position logprobs; the pairing happens after, here,
from those stored files (`pair_stage`, called by the flow once the stage has scored its corpus).

Both stages scored the same corpus with echo=true (evalsets.perplexity), which kept, per
position, the top-k alternatives (k = 20 by default) plus the scored token. The full
distributions are gone, so per position the KL is computed on a coarsened support: the union
U of the token ids either side listed, plus one "rest" bucket for everything else.

For a token in U that one side did not list, that side's probability is unknown but bounded:
it is at most that side's k-th largest listed probability (it did not make the top k) and at
most the side's unlisted mass 1 - sum(listed). It is set to min(both bounds, an equal share of
the unlisted mass) and the remaining unlisted mass becomes that side's "rest" bucket. When the
two sides list the same ids this is exact KL over the coarsened support, a lower bound of the
true KL (data processing inequality); when they differ, the filled values are estimates. On
the prose corpus and SmolLM2-135M the top-20 holds ~76 % of the mass on average (median
unlisted mass 0.19), so the figure is a coarsened KL: consistent across stages and fine for
ranking and gating them, but below the full-vocabulary KL (W4A16 g64 RTN: 0.28 here, ~0.54 full
vocabulary in FACTS.md). The limits in gates/policy.yaml are calibrated on this estimator over
the scoring corpus (evalsets.token_corpus; `python -m tools.calibrate` prints the table).

The pairing computes per-position values only (KL, top-1 agreement, NLL differences), stored
with the stage (`PairedTokens`); the gates compute every interval from them (gates.stats
`block_bootstrap`, with the policy's level, resamples and seed), so a stored run re-gates exactly.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np

from evalsets.perplexity import LEGACY_LOGPROBS_FILE, LOGPROBS_FILE, read_logprobs
from evalsets.results import Divergence, PairedTokens, PerplexityRatio, QualityResult
from infra.errors import MeasurementError

log = logging.getLogger(__name__)

# Probability floor: a side's "rest" can be numerically zero while the other's is not.
FLOOR = 1e-10


def _read(path: Path) -> dict:
    """A stage's per-position logprobs, given the file or the folder holding it."""
    file = path
    if path.is_dir():
        file = path / LOGPROBS_FILE
        if not file.exists() and (path / LEGACY_LOGPROBS_FILE).exists():
            file = path / LEGACY_LOGPROBS_FILE
    try:
        data = read_logprobs(file)
        data["texts"]  # noqa: B018 - shape check
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise MeasurementError(f"divergence: cannot read per-position logprobs {file}: {exc!r}") from exc
    data["_path"] = str(file)
    return data


def _side(listed: dict[str, float], top_k: int, union: list[str]) -> np.ndarray:
    """Probabilities over `union` + rest for one side, unlisted ids filled within their bounds."""
    probs = {token: math.exp(logprob) for token, logprob in listed.items()}
    unlisted_mass = max(0.0, 1.0 - sum(probs.values()))
    ranked = sorted(probs.values(), reverse=True)
    kth = ranked[top_k - 1] if len(ranked) >= top_k else unlisted_mass
    missing = [token for token in union if token not in probs]
    share = unlisted_mass / (len(missing) + 1) if missing else 0.0
    fill = min(kth, share)
    values = [probs.get(token, fill) for token in union]
    rest = unlisted_mass - fill * len(missing)
    return np.maximum(np.array([*values, rest]), FLOOR)


def position_kl(baseline: dict[str, float], stage: dict[str, float], top_k: int,
                stage_top_k: int | None = None) -> float:
    """KL(baseline || stage) in nats over the union of listed ids plus a rest bucket."""
    union = sorted(set(baseline) | set(stage))
    p = _side(baseline, top_k, union)
    q = _side(stage, stage_top_k or top_k, union)
    p, q = p / p.sum(), q / q.sum()
    return max(0.0, float(np.sum(p * (np.log(p) - np.log(q)))))


def _top1(listed: dict[str, float]) -> str:
    return max(listed.items(), key=lambda pair: (pair[1], pair[0]))[0]


def _paired_texts(stage: dict, base: dict) -> list[tuple[str, dict, dict]]:
    """(name, baseline text, stage text) for every corpus text, refused unless tokens match."""
    if set(stage["texts"]) != set(base["texts"]):
        raise MeasurementError(
            f"divergence: different corpus texts: stage {sorted(stage['texts'])} vs baseline "
            f"{sorted(base['texts'])} ({stage['_path']} vs {base['_path']})")
    pairs = []
    for name in sorted(base["texts"]):
        b, s = base["texts"][name], stage["texts"][name]
        if b["tokens"] != s["tokens"]:
            where = next((i for i, (x, y) in enumerate(zip(b["tokens"], s["tokens"], strict=False))
                          if x != y), min(len(b["tokens"]), len(s["tokens"])))
            raise MeasurementError(
                f"divergence: text {name!r} tokenized differently at position {where} "
                f"(baseline {len(b['tokens'])} tokens, stage {len(s['tokens'])}): the stages "
                f"must share one tokenizer to be compared token by token")
        pairs.append((name, b, s))
    return pairs


def _series(stage: dict, reference: dict) -> tuple[list[tuple[str, int]], list]:
    pairs = _paired_texts(stage, reference)
    return [(name, len(b["tokens"])) for name, b, _ in pairs], pairs


def nll_differences(stage: dict, reference: dict) -> np.ndarray:
    """Per position, stage NLL - reference NLL (nats), in the reference's text order."""
    _, pairs = _series(stage, reference)
    return np.array([r_lp - s_lp for _, r, s in pairs
                     for r_lp, s_lp in zip(r["logprobs"], s["logprobs"], strict=True)], dtype=float)


def paired_tokens(stage_logprobs: Path, baseline_logprobs: Path,
                  parent_logprobs: Path | None = None) -> PairedTokens:
    """Per-position KL(baseline || stage), top-1 agreement and NLL differences to the baseline
    and (if given and scored on the same tokens) the parent.

    Each argument may be a logprobs file or the quality folder holding it. Stage and
    baseline must have scored the same texts into the same tokens; otherwise this raises
    MeasurementError naming the first text and position that differ. A parent that differs
    leaves `nll_diff_vs_parent` empty (logged), which the perplexity rule treats as missing.
    """
    stage, base = _read(stage_logprobs), _read(baseline_logprobs)
    base_k, stage_k = int(base.get("top_logprobs", 5)), int(stage.get("top_logprobs", 5))
    spans, pairs = _series(stage, base)
    kls, agree = [], []
    for name, b, s in pairs:
        for b_top, s_top in zip(b["top"], s["top"], strict=True):
            if not b_top or not s_top:
                raise MeasurementError(f"divergence: text {name!r} has positions without top "
                                       f"logprobs (re-measure perplexity with logprobs > 0)")
            kls.append(position_kl(b_top, s_top, base_k, stage_k))
            agree.append(_top1(b_top) == _top1(s_top))
    if not kls:
        raise MeasurementError("divergence: no token positions to compare")
    vs_baseline = nll_differences(stage, base)
    vs_parent = None
    if parent_logprobs is not None and Path(parent_logprobs) == Path(baseline_logprobs):
        vs_parent = vs_baseline  # the first stage's parent is the baseline: the same pair, once
    elif parent_logprobs is not None:
        parent = _read(parent_logprobs)
        try:
            if [name for name, _ in _series(stage, parent)[0]] != [name for name, _ in spans]:
                raise MeasurementError("divergence: parent and baseline texts are ordered differently")
            vs_parent = nll_differences(stage, parent)
        except MeasurementError as err:
            log.error("paired perplexity against the parent: %s", err)
    return PairedTokens.from_values(
        min(base_k, stage_k), spans, kl=np.array(kls), top1_agree=np.array(agree),
        nll_diff_vs_baseline=vs_baseline, nll_diff_vs_parent=vs_parent,
    )


def summaries(tokens: PairedTokens) -> tuple[Divergence, PerplexityRatio, PerplexityRatio | None]:
    """Point estimates for display and tracking: divergence, perplexity ratio to baseline, parent."""
    kl, agree = tokens.values("kl"), tokens.values("top1_agree")
    div = Divergence(tokens=tokens.tokens, mean_kl=float(kl.mean()),
                     top1_agreement=float(agree.mean()), top_k=tokens.top_k)
    ratios = []
    for name in ("nll_diff_vs_baseline", "nll_diff_vs_parent"):
        values = tokens.values(name)
        ratios.append(None if values is None else
                      PerplexityRatio(tokens=values.size, ratio=math.exp(float(values.mean()))))
    return div, ratios[0], ratios[1]


def divergence(stage_logprobs: Path, baseline_logprobs: Path) -> Divergence:
    """Mean per-token KL(baseline || stage) and top-1 agreement (point estimates)."""
    return summaries(paired_tokens(stage_logprobs, baseline_logprobs))[0]


def perplexity_ratio(stage_logprobs: Path, reference_logprobs: Path) -> PerplexityRatio:
    """Stage / reference perplexity on the same tokens: exp of the mean per-token NLL
    difference, paired token by token (a hard passage is hard for both)."""
    differences = nll_differences(_read(stage_logprobs), _read(reference_logprobs))
    if differences.size == 0:
        raise MeasurementError("perplexity ratio: no token positions to compare")
    return PerplexityRatio(tokens=differences.size, ratio=math.exp(float(differences.mean())))


def pair_stage(quality: QualityResult, stage_dir: Path, baseline_dir: Path,
               parent_dir: Path | None) -> QualityResult:
    """The stage's per-token KL, top-1 agreement and NLL differences to the baseline and the
    parent (their quality folders), set on `quality` with their point estimates; left None when
    they cannot be computed (say, another tokenizer, or no corpus scored): missing to the gates."""
    try:
        quality.paired_tokens = paired_tokens(stage_dir, baseline_dir, parent_dir)
        (quality.divergence, quality.perplexity_vs_baseline,
         quality.perplexity_vs_parent) = summaries(quality.paired_tokens)
    except MeasurementError as err:
        log.error("quality: no divergence to the baseline: %s", err)
    return quality
