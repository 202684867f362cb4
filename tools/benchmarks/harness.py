"""How close the eval harness gets to the engine's throughput: a script that prints a table.

For each eval set it runs lm-eval (the same code path as the acceptance flow) at several
`num_concurrent` levels, then replays the very requests lm-eval sent (same messages, same
generation settings, same greedy outputs) straight at the server with many concurrent
requests: the engine's saturated throughput on that workload. The ratio of the two, in output
tokens per second, is the harness efficiency; the goal is >= 80 %. For reference it also
measures the engine's plain decode saturation (short prompt, `ignore_eos`, fixed length).
Every run starts with an empty prefix cache when the server allows it (VLLM_SERVER_DEV_MODE=1).

    python -m tools.benchmarks.harness --base-url http://127.0.0.1:8107 --sets math long_context
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from pydantic import BaseModel

from evalsets.runner import SAMPLES_FILE, check_server, recording_model, run_evalset, token_counter
from evalsets.spec import EvalSetSpec
from infra.errors import MeasurementError

GOAL = 0.80


class Throughput(BaseModel):
    label: str
    items: int
    seconds: float
    output_tokens: int

    @property
    def items_per_s(self) -> float:
        return self.items / self.seconds

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.seconds


def reset_prefix_cache(base_url: str) -> bool:
    """Empty the server's prefix cache, so that a run does not reuse the previous run's prompts.

    vLLM serves POST /reset_prefix_cache only with VLLM_SERVER_DEV_MODE=1; False when it cannot.
    """
    try:
        response = httpx.post(f"{base_url.rstrip('/')}/reset_prefix_cache", timeout=30)
        return response.status_code == 200 and bool(response.json().get("success"))
    except (httpx.HTTPError, ValueError):
        return False


def measure_eval(base_url: str, model: str, spec: EvalSetSpec, out_dir: Path, count_tokens,
                 num_concurrent: int) -> Throughput:
    """One lm-eval run, wall clock including lm-eval's own set-up (the flow pays for it too)."""
    reset_prefix_cache(base_url)
    started = time.perf_counter()
    task = run_evalset(base_url, model, spec, out_dir, count_tokens, num_concurrent=num_concurrent)
    seconds = time.perf_counter() - started
    tokens = sum(item.output_tokens or 0 for item in task.items)
    return Throughput(label=f"lm-eval nc={num_concurrent}", items=len(task.items),
                      seconds=seconds, output_tokens=tokens)


def logged_payloads(samples_file: Path, model: str, base_url: str) -> list[dict[str, Any]]:
    """The chat payloads lm-eval sent, rebuilt by lm-eval's own payload code from its sample log."""
    lm = recording_model(True, model=model, base_url=base_url, tokenizer_backend=None,
                         tokenized_requests=False)
    payloads = []
    for line in samples_file.read_text().splitlines():
        arguments = json.loads(line)["arguments"]
        # lm-eval's own files: {"gen_args_0": {"arg_0": .., "arg_1": ..}}; ours: [[ctx, kwargs]].
        if isinstance(arguments, dict):
            context, gen_kwargs = arguments["gen_args_0"]["arg_0"], arguments["gen_args_0"]["arg_1"]
        else:
            context, gen_kwargs = arguments[0]
        if isinstance(context, list):  # lm-eval's JsonChatStr, a one-field tuple, saved as a list
            context = context[0]
        payloads.append(lm._create_payload(json.loads(context), generate=True,
                                           gen_kwargs=dict(gen_kwargs), eos=None))
    return payloads


async def _replay(url: str, payloads: list[dict[str, Any]], concurrency: int) -> tuple[float, int]:
    gate = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency)

    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        async def one(payload: dict[str, Any]) -> int:
            async with gate:
                response = await client.post(url, json=payload)
                response.raise_for_status()
                return int(response.json()["usage"]["completion_tokens"])

        started = time.perf_counter()
        tokens = await asyncio.gather(*(one(p) for p in payloads))
        return time.perf_counter() - started, sum(tokens)


def measure_saturated(base_url: str, payloads: list[dict[str, Any]], concurrency: int,
                      label: str) -> Throughput:
    reset_prefix_cache(base_url)
    url = f"{base_url.rstrip('/')}/v1/chat/completions"
    seconds, tokens = asyncio.run(_replay(url, payloads, concurrency))
    return Throughput(label=label, items=len(payloads), seconds=seconds, output_tokens=tokens)


def decode_payloads(model: str, count: int, output_tokens: int) -> list[dict[str, Any]]:
    prompt = "Write a long story about a lighthouse keeper and a storm."
    return [{"model": model, "messages": [{"role": "user", "content": prompt}],
             "max_tokens": output_tokens, "temperature": 0, "ignore_eos": True}
            for _ in range(count)]


def benchmark_set(base_url: str, model: str, spec: EvalSetSpec, levels: list[int],
                  saturation: int, count_tokens, work: Path) -> list[Throughput]:
    rows = []
    for level in levels:
        rows.append(measure_eval(base_url, model, spec, work / f"nc{level}", count_tokens, level))
        print(f"  {spec.name} {rows[-1].label}: {rows[-1].items_per_s:.2f} items/s, "
              f"{rows[-1].tokens_per_s:.1f} output tok/s", flush=True)
    samples = work / f"nc{levels[-1]}" / spec.name / SAMPLES_FILE
    payloads = logged_payloads(samples, model, base_url)
    rows.append(measure_saturated(base_url, payloads, saturation, f"direct c={saturation}"))
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8107")
    parser.add_argument("--sets", nargs="+", default=["math", "long_context"])
    parser.add_argument("--limit", type=int, default=32, help="Items per set (first N).")
    parser.add_argument("--levels", type=int, nargs="+", default=[4, 16, 64])
    parser.add_argument("--saturation", type=int, default=64, help="Concurrent direct requests.")
    parser.add_argument("--tokenizer", type=Path, default=Path("models/smollm2-135m-bf16"))
    args = parser.parse_args(argv)

    models = httpx.get(f"{args.base_url}/v1/models", timeout=10).json()["data"]
    model = models[0]["id"]
    check_server(args.base_url, model)
    count_tokens = token_counter(args.tokenizer)
    if not reset_prefix_cache(args.base_url):
        print("warning: the server does not reset its prefix cache (start it with "
              "VLLM_SERVER_DEV_MODE=1): later runs of a set reuse the prompts the earlier ones "
              "cached, which flatters them (long-context most)")
    decode = measure_saturated(args.base_url, decode_payloads(model, 2 * args.saturation, 128),
                               args.saturation, f"decode c={args.saturation}")
    print(f"engine decode saturation: {decode.tokens_per_s:.1f} output tok/s "
          f"({decode.items} x 128 tokens, {args.saturation} concurrent)")
    with tempfile.TemporaryDirectory(prefix="qg-bench-") as tmp:
        for name in args.sets:
            spec = EvalSetSpec(name=name, limit=args.limit)
            try:
                rows = benchmark_set(args.base_url, model, spec, args.levels, args.saturation,
                                     count_tokens, Path(tmp) / name)
            except MeasurementError as err:
                print(f"{name}: failed: {err}")
                continue
            saturated = rows[-1]
            best = max(rows[:-1], key=lambda r: r.tokens_per_s)
            print(f"\n{name} ({saturated.items} items)")
            print(f"  {'run':<16}{'items/s':>9}{'out tok/s':>11}{'vs direct':>11}{'vs decode':>11}")
            for row in rows:
                print(f"  {row.label:<16}{row.items_per_s:>9.2f}{row.tokens_per_s:>11.1f}"
                      f"{row.tokens_per_s / saturated.tokens_per_s:>10.0%}"
                      f"{row.tokens_per_s / decode.tokens_per_s:>11.0%}")
            ratio = best.tokens_per_s / saturated.tokens_per_s
            verdict = "meets" if ratio >= GOAL else "misses"
            print(f"  best: {best.label}, {ratio:.0%} of the saturated same-workload throughput "
                  f"({verdict} the {GOAL:.0%} goal)")


if __name__ == "__main__":
    main()
