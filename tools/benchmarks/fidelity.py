"""Fidelity benchmark: quantgate's Locust numbers against `vllm bench serve`, same server, same work.

    flock /tmp/qg/engine.lock python -m tools.benchmarks.fidelity --model-dir models/smollm2-135m-bf16

Starts a vLLM server (or uses --base-url), then per concurrency runs both clients with the same
random-token workload (prompt and output lengths, ignore_eos, closed loop at the same
concurrency, same request count and warm-up count) and prints TTFT/TPOT medians, output
throughput and quantgate/vLLM ratios. Goal: medians within ±5 %, throughput ratio >= 0.95.
The two clients take turns in many short runs (ABBA..., --rounds, default 6), and each run is
compared with its neighbour in the same round, so a shared machine whose speed swings does not
favour one side (see `compare`).

The engine it starts runs on cores of its own and both clients on the rest (`--shared-cores`: all
on every core, as quantgate runs below 4 cores). Sharing, a client's own CPU time is taken from
the engine's threads: on 2 cores vLLM's heavier client slowed the engine it timed (TTFT up to 7 %
and TPOT up to 9 % above Locust at concurrency 1, per-round ratios from 0.71 to 1.04), a
difference in the clients' cost to the engine, not in what they read.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np

from infra.cores import CorePlan, format_cores, plan_cores, usable_cores
from infra.process import log_tail
from infra.quiet import quiet
from load.profile import LoadProfile
from load.runner import measured_part, run_level
from load.stats import summarize

TTFT_TPOT_TOLERANCE = 0.05
MIN_THROUGHPUT_RATIO = 0.95
WARMUP_RUN_REQUESTS_PER_USER = 3


def quantgate_side(base_url: str, model: str, profile: LoadProfile, users: int, out: Path,
                   cores: CorePlan | None = None) -> dict:
    level = f"c{users}"
    samples = run_level(base_url, model, profile, level, users, out, cores=cores)
    measured, span_s = measured_part(samples, profile, level)
    summary = summarize(measured, level, users, span_s)
    # vLLM's client ends a request at its last token, quantgate's at [DONE]: the gap between
    # them is in quantgate's TPOT only, so it is shown.
    done_gaps = [s.e2e_ms - s.ttft_ms - sum(s.itl_ms) for s in measured if s.error is None]
    return {
        "requests": summary.requests,
        "errors": summary.errors,
        "median_ttft_ms": summary.ttft_p50_ms,
        "median_tpot_ms": summary.tpot_p50_ms,
        "output_throughput": summary.output_tokens_per_s,
        "request_throughput": summary.requests_per_s,
        "duration_s": span_s,
        "median_done_gap_ms": float(np.median(done_gaps)) if done_gaps else None,
    }


def vllm_side(
    base_url: str, model: str, tokenizer: str, profile: LoadProfile, users: int, out: Path,
    cores: CorePlan | None = None,
) -> dict:
    name = f"vllm_bench_c{users}.json"
    command = [
        sys.executable, "-m", "tools.benchmarks.vllm_bench", "bench", "serve",
        "--backend", "openai", "--endpoint", "/v1/completions", "--base-url", base_url,
        "--model", model, "--tokenizer", tokenizer,
        "--dataset-name", "random", "--random-input-len", str(profile.prompt_tokens),
        "--random-output-len", str(profile.output_tokens), "--random-range-ratio", "0",
        "--ignore-eos", "--temperature", "0",
        "--max-concurrency", str(users), "--request-rate", "inf",
        "--num-prompts", str(profile.requests), "--num-warmups", str(profile.warmup_requests),
        "--seed", str(profile.seed), "--percentile-metrics", "ttft,tpot,itl,e2el",
        "--disable-tqdm", "--save-result", "--result-dir", str(out), "--result-filename", name,
    ]  # fmt: skip
    log_path = out / f"vllm_bench_c{users}.log"
    env = os.environ | {"VLLM_TARGET_DEVICE": os.environ.get("VLLM_TARGET_DEVICE", "cpu")} | quiet(
        "HF_HUB_OFFLINE", "VLLM_NO_USAGE_STATS")
    if cores is not None:
        command = cores.pin(command)
    with open(log_path, "w") as log:
        code = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env=env,
                              timeout=1800).returncode
    if code != 0:
        raise SystemExit(f"vllm bench serve exited with {code}; log {log_path}:\n{log_tail(log_path, 30)}")
    data = json.loads((out / name).read_text())
    return {
        "requests": data["completed"],
        "errors": data.get("failed", 0),
        "median_ttft_ms": data["median_ttft_ms"],
        "median_tpot_ms": data["median_tpot_ms"],
        "output_throughput": data["output_throughput"],
        "request_throughput": data["request_throughput"],
        "duration_s": data["duration"],
    }


def ratios(ours: dict, theirs: dict) -> dict:
    keys = ("median_ttft_ms", "median_tpot_ms", "output_throughput")
    return {key: ours[key] / theirs[key] if ours[key] and theirs[key] else None for key in keys}


def verdict(ratio: dict) -> bool:
    ttft, tpot, tput = ratio["median_ttft_ms"], ratio["median_tpot_ms"], ratio["output_throughput"]
    if None in (ttft, tpot, tput):
        return False
    return (
        abs(ttft - 1) <= TTFT_TPOT_TOLERANCE
        and abs(tpot - 1) <= TTFT_TPOT_TOLERANCE
        and tput >= MIN_THROUGHPUT_RATIO
    )


def compare(base_url: str, model: str, tokenizer: str, profile: LoadProfile, users: list[int],
            out: Path, rounds: int = 6, requests_per_user: int = 8,
            warmup_per_user: int = 1, cores: CorePlan | None = None) -> list[dict]:
    """Per concurrency, `rounds` rounds of one short run per side (ABBA...); paired ratios.

    A shared machine's speed swings by tens of percent within a minute, so a few long runs
    compare different machines. Many short runs, each compared with its neighbour in the same
    round, cancel what the neighbours share; the ratio is the median over rounds. At
    concurrency > 1 a closed loop also keeps, for the whole run, whichever grouping of prefills
    its first requests fell into; short runs sample that grouping anew each time.

    Every run has `requests_per_user` x concurrency measured requests after `warmup_per_user` x
    concurrency warm-up ones: whole rounds of the closed loop, as vLLM measures them (a partial
    round would leave users idle inside the measured span). Each concurrency starts with an
    unmeasured run that warms the engine, and every run has a seed of its own, so no run
    replays another's prompts.
    """
    rows = []
    seeds = itertools.count(profile.seed)
    for concurrency in users:
        sized = profile.model_copy(update={"requests": requests_per_user * concurrency,
                                           "warmup_requests": warmup_per_user * concurrency})
        warmup = sized.model_copy(update={"seed": next(seeds), "warmup_requests": 0,
                                          "requests": WARMUP_RUN_REQUESTS_PER_USER * concurrency})
        run_level(base_url, model, warmup, f"c{concurrency}", concurrency,
                  out / f"c{concurrency}-warmup", cores=cores)
        runs: dict[str, list[dict]] = {"quantgate": [], "vllm": []}
        order = [side for r in range(rounds)
                 for side in (("quantgate", "vllm") if r % 2 == 0 else ("vllm", "quantgate"))]
        for index, side in enumerate(order):
            run_out = out / f"c{concurrency}-run{index + 1}"
            run_out.mkdir(parents=True, exist_ok=True)
            run_profile = sized.model_copy(update={"seed": next(seeds)})
            if side == "quantgate":
                figures = quantgate_side(base_url, model, run_profile, concurrency, run_out, cores)
            else:
                figures = vllm_side(base_url, model, tokenizer, run_profile, concurrency, run_out,
                                    cores)
            runs[side].append(figures)
            print(f"c={concurrency} run {index + 1} {side}: {json.dumps(figures)}", flush=True)
        per_round = [ratios(ours, theirs)
                     for ours, theirs in zip(runs["quantgate"], runs["vllm"], strict=True)]
        ratio = {key: _median([r[key] for r in per_round]) for key in per_round[0]}
        sides = {side: _mean(figures) for side, figures in runs.items()}
        rows.append({"concurrency": concurrency, "order": order, "runs": runs, **sides,
                     "round_ratios": per_round, "ratio": ratio, "within_goal": verdict(ratio)})
    return rows


def _median(values: list[float | None]) -> float | None:
    # The median, not the mean: another tenant's burst can land on one side of a round only,
    # and one such round must not move the verdict.
    if not values or any(v is None for v in values):
        return None
    return float(np.median(values))


def _mean(figures: list[dict]) -> dict:
    return {key: sum(f[key] for f in figures) / len(figures) for key in figures[0]
            if all(f[key] is not None for f in figures)}


def print_table(rows: list[dict]) -> None:
    print(f"\n{'conc':>4} {'side':>9} {'TTFT p50 ms':>12} {'TPOT p50 ms':>12} {'out tok/s':>10} {'req':>5}")
    for row in rows:
        for side in ("quantgate", "vllm"):
            s = row[side]
            print(f"{row['concurrency']:>4} {side:>9} {s['median_ttft_ms']:>12.2f} "
                  f"{s['median_tpot_ms']:>12.2f} {s['output_throughput']:>10.2f} {s['requests']:>5}")
        r = row["ratio"]
        print(f"{row['concurrency']:>4} {'ratio':>9} {_fmt(r['median_ttft_ms']):>12} "
              f"{_fmt(r['median_tpot_ms']):>12} {_fmt(r['output_throughput']):>10}  "
              f"{'within goal' if row['within_goal'] else 'MISSES goal'}")
        for key, label in (("median_ttft_ms", "TTFT"), ("median_tpot_ms", "TPOT"),
                           ("output_throughput", "throughput")):
            each = " ".join(_fmt(r[key]) for r in row["round_ratios"])
            print(f"{'':>4} {'':>9} {label} ratio per round: {each}")


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, default=Path("models/smollm2-135m-bf16"))
    parser.add_argument("--base-url", help="Use this running server instead of starting one.")
    parser.add_argument("--port", type=int, default=8105)
    parser.add_argument("--concurrency", default="1,4", help="Comma-separated, e.g. 1,4")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--output-tokens", type=int, default=32)
    parser.add_argument("--requests-per-user", type=int, default=8,
                        help="Measured requests per run: this many per concurrent user.")
    parser.add_argument("--warmup-per-user", type=int, default=1,
                        help="Unmeasured requests at the start of every run, per user.")
    parser.add_argument("--rounds", type=int, default=6,
                        help="Rounds of one run per side, in ABBA order.")
    parser.add_argument("--out", type=Path, default=Path("runs/fidelity"))
    parser.add_argument("--shared-cores", action="store_true",
                        help="Engine and clients on every core (default: cores of their own).")
    args = parser.parse_args(argv)
    # SIGTERM (e.g. from `timeout`) unwinds like Ctrl-C, so the server and Locust are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    users = [int(c) for c in args.concurrency.split(",")]
    profile = LoadProfile(
        low_users=min(users), high_users=max(users), prompt_tokens=args.prompt_tokens,
        output_tokens=args.output_tokens, requests=args.requests_per_user,
        warmup_requests=args.warmup_per_user, request_timeout_s=300,
    )
    sizes = {"rounds": args.rounds, "requests_per_user": args.requests_per_user,
             "warmup_per_user": args.warmup_per_user}
    args.out.mkdir(parents=True, exist_ok=True)
    tokenizer = str(args.model_dir.resolve())
    if args.base_url:
        from infra.probe import get_json

        model = get_json(args.base_url, "/v1/models")["data"][0]["id"]
        rows = compare(args.base_url, model, tokenizer, profile, users, args.out, **sizes)
    else:
        from flows.spec import EngineFlags, VllmEngineSpec
        from infra.vllm_engine import VllmEngine

        usable = usable_cores()
        split = not args.shared_cores and len(usable) >= 2
        # Split: the lowest core for the clients (as infra/cores.py plans), the rest the engine's.
        bind = format_cores(usable[1:] if split else usable)
        cores = plan_cores("cpu", bind, usable) if split else None
        spec = VllmEngineSpec(port=args.port, enforce_eager=True, omp_threads_bind=bind,
                              kv_cache_space_gib=1)
        engine = VllmEngine(spec, args.model_dir.resolve(), EngineFlags(), args.out / "engine.log")
        if cores is not None:  # the whole engine (its API server too) inherits the engine's cores
            os.sched_setaffinity(0, cores.engine)
        with engine as facts:
            os.sched_setaffinity(0, usable)
            print(f"server {facts.ready_line()}: {facts.base_url} ({facts.model}); "
                  f"engine on cores {bind}, clients on "
                  f"{format_cores(cores.client) if cores else 'the same cores'}", flush=True)
            rows = compare(facts.base_url, facts.model, tokenizer, profile, users, args.out,
                           **sizes, cores=cores)
    (args.out / "fidelity.json").write_text(json.dumps(rows, indent=1))
    print_table(rows)
    return 0 if all(row["within_goal"] for row in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
