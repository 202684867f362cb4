"""A discrete-event model of a vLLM-like continuous-batching scheduler, one step at a time.

Each step (as vLLM V1 schedules it): every running sequence, oldest first, asks for the tokens it
has not computed yet (1 when decoding, the rest of its prompt when prefilling) and gets what is
left of the token budget (chunked prefill mixed with decode); then waiting requests are admitted,
oldest first, while the budget, the running-sequence limit and the KV block pool allow. When a
growing sequence finds no free KV block, the youngest running sequence is preempted: it frees its
blocks and goes back to the front of the queue to recompute prompt and output so far. A step
takes the roofline's time for what it carries; its sequences advance when it ends.

Left out: prefix caching (prompts are random), speculative decoding, CUDA-graph batch padding,
the detokenizer and HTTP front end (their cost is inside the per-step overhead).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from gates.whatif.steptime import Roofline
from infra.errors import SpecError


class SchedulerConfig(BaseModel):
    """The engine flags that shape batching (vLLM's names and defaults for an 80 GB GPU)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_num_batched_tokens: int = Field(default=8192, gt=0, description="Token budget per step.")
    max_num_seqs: int = Field(default=1024, gt=0, description="Running sequences at most.")
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)
    block_size: int = Field(default=16, gt=0, description="Tokens per KV block.")
    kv_cache_gib: float | None = Field(
        default=None,
        gt=0,
        description="A fixed KV pool (vLLM --kv-cache-memory-bytes, VLLM_CPU_KVCACHE_SPACE); "
        "None: what gpu_memory_utilization leaves after weights and the reserve.",
    )


@dataclass(frozen=True)
class SimResult:
    """Per-request latencies of the measured requests (inf where a request did not finish)."""

    ttft_ms: np.ndarray
    tpot_ms: np.ndarray
    kv_pool_tokens: int
    preemptions: int
    steps: int
    max_running: int


def kv_pool_blocks(roofline: Roofline, config: SchedulerConfig) -> int:
    """KV blocks that fit in the memory left after weights and vLLM's reserve."""
    device, shape, fmt = roofline.device, roofline.shape, roofline.fmt
    free = (
        device.memory_bytes * config.gpu_memory_utilization
        - fmt.resident_weight_bytes(shape)
        - device.efficiency.reserved_memory_gib * 2**30
    )
    if config.kv_cache_gib is not None:
        free = config.kv_cache_gib * 2**30
    block_bytes = config.block_size * fmt.kv_bytes_per_token(shape)
    blocks = int(free // block_bytes)
    if blocks <= 0:
        raise SpecError(
            f"{device.key}: weights ({fmt.resident_weight_bytes(shape) / 2**30:.1f} GiB) leave no "
            f"room for a KV cache in {device.memory_gib:g} GiB x {config.gpu_memory_utilization}"
        )
    return blocks


def _decode_run(
    roofline: Roofline,
    running: np.ndarray,
    known: np.ndarray,
    computed: np.ndarray,
    total_tokens: int,
    now: float,
    next_event_s: float,
    attention_coef: float,
) -> tuple[float, int]:
    """Run pure-decode steps at once until the next arrival or the first completion.

    Nothing waits and every running sequence decodes, so each step until then carries the same
    sequences with one more cached token each: their times are known in advance. Updates
    `known` and `computed` in place; returns (time after the last step, steps taken).
    """
    sequences = len(running)
    steps_left = int(np.min(total_tokens - known[running]))
    index = np.arange(steps_left)
    context = float(np.sum(computed[running])) + sequences * (index + 1)
    times = roofline.step_s(
        tokens=sequences,
        logit_rows=sequences,
        attention_flops=attention_coef * context,
        kv_tokens_read=context,
    )
    starts = now + np.concatenate([[0.0], np.cumsum(times)[:-1]])
    taken = max(1, int(np.searchsorted(starts, next_event_s, side="left")))
    computed[running] += taken
    known[running] += taken
    return now + float(np.sum(times[:taken])), taken


def simulate(
    roofline: Roofline,
    config: SchedulerConfig,
    arrivals_s: np.ndarray,
    prompt_tokens: int,
    output_tokens: int,
    measured: np.ndarray,
    deadline_s: float = math.inf,
    ttft_limit_s: float = math.inf,
    max_late: int | None = None,
) -> SimResult:
    """Serve requests arriving at `arrivals_s` (sorted); latencies of those where `measured`.

    The run stops when every measured request finished, at `deadline_s`, or once more than
    `max_late` measured requests are past `ttft_limit_s` without a first token or got it later
    (the SLO is lost: an overloaded rate is judged in a fraction of its run). Unfinished
    requests get inf.
    """
    count = len(arrivals_s)
    blocks_total = kv_pool_blocks(roofline, config)
    block = config.block_size
    if math.ceil((prompt_tokens + output_tokens) / block) > blocks_total:
        raise SpecError(
            f"one request of {prompt_tokens + output_tokens} tokens needs more KV than the pool "
            f"({blocks_total * block} tokens) on {roofline.device.key}"
        )
    attention_coef = roofline.shape.attention_flops(0, 1)  # FLOPs per (query, key) pair
    known = np.full(count, prompt_tokens, dtype=np.int64)  # prompt + sampled tokens
    computed = np.zeros(count, dtype=np.int64)  # tokens whose KV is cached
    first_token = np.full(count, np.nan)
    finish = np.full(count, np.nan)
    waiting: deque[int] = deque()
    running = np.empty(0, dtype=np.int64)  # oldest first
    pending_measured = int(measured.sum())
    now, next_arrival, steps, preemptions, max_running = 0.0, 0, 0, 0, 0
    budget_total, max_seqs = config.max_num_batched_tokens, config.max_num_seqs

    iteration = 0
    while pending_measured > 0 and now < deadline_s:
        iteration += 1
        if max_late is not None and iteration % 64 == 0:
            waited = np.where(np.isnan(first_token), now, first_token) - arrivals_s
            if np.count_nonzero(measured & (arrivals_s <= now) & (waited > ttft_limit_s)) > max_late:
                break
        while next_arrival < count and arrivals_s[next_arrival] <= now:
            waiting.append(next_arrival)
            next_arrival += 1
        if not len(running) and not waiting:
            if next_arrival >= count:
                break
            now = float(arrivals_s[next_arrival])
            continue

        want = known[running] - computed[running]
        if not waiting and len(running) and bool(np.all(want == 1)):
            now, taken = _decode_run(
                roofline, running, known, computed, prompt_tokens + output_tokens,
                now, float(arrivals_s[next_arrival]) if next_arrival < count else deadline_s,
                attention_coef,
            )
            steps += taken
            max_running = max(max_running, len(running))
            finished = known[running] - prompt_tokens >= output_tokens
            if finished.any():
                done = running[finished]
                finish[done] = now
                pending_measured -= int(measured[done].sum())
                running = running[~finished]
            continue
        before = np.cumsum(want) - want
        scheduled = np.clip(budget_total - before, 0, want)
        # Blocks after this step; preempt the youngest until the growth fits the pool.
        need = -(-(computed[running] + scheduled) // block)
        while len(running) and need.sum() > blocks_total:
            victim = running[-1]
            computed[victim] = 0
            waiting.appendleft(int(victim))
            running, scheduled, need = running[:-1], scheduled[:-1], need[:-1]
            preemptions += 1
        budget = budget_total - int(scheduled.sum())
        free_blocks = blocks_total - int(need.sum())
        admitted: list[int] = []
        chunks: list[int] = []
        while waiting and budget > 0 and len(running) + len(admitted) < max_seqs:
            candidate = waiting[0]
            chunk = min(int(known[candidate] - computed[candidate]), budget)
            blocks = -(-chunk // block)
            if blocks > free_blocks:
                break
            waiting.popleft()
            admitted.append(candidate)
            chunks.append(chunk)
            budget -= chunk
            free_blocks -= blocks
        if admitted:
            running = np.concatenate([running, np.asarray(admitted, dtype=np.int64)])
            scheduled = np.concatenate([scheduled, np.asarray(chunks, dtype=np.int64)])
        if not len(running):
            now = float(arrivals_s[next_arrival]) if next_arrival < count else deadline_s
            continue

        past = computed[running]
        samples = past + scheduled >= known[running]
        pairs = float(np.sum(scheduled * past + scheduled * (scheduled + 1) / 2))
        now += roofline.step_s(
            tokens=float(scheduled.sum()),
            logit_rows=float(samples.sum()),
            attention_flops=attention_coef * pairs,
            kv_tokens_read=float(np.sum(past + scheduled)),
        )
        steps += 1
        max_running = max(max_running, len(running))
        computed[running] = past + scheduled
        sampled = running[samples]
        first = sampled[np.isnan(first_token[sampled])]
        first_token[first] = now
        known[sampled] += 1
        # Only a sequence that sampled can have finished: the others had tokens left before.
        finished = samples & (known[running] - prompt_tokens >= output_tokens)
        if finished.any():
            done = running[finished]
            finish[done] = now
            pending_measured -= int(measured[done].sum())
            running = running[~finished]

    ttft = (first_token - arrivals_s) * 1e3
    tpot = (finish - first_token) / max(output_tokens - 1, 1) * 1e3
    return SimResult(
        ttft_ms=np.nan_to_num(ttft[measured], nan=np.inf),
        tpot_ms=np.nan_to_num(tpot[measured], nan=np.inf),
        kv_pool_tokens=blocks_total * block,
        preemptions=preemptions,
        steps=steps,
        max_running=max_running,
    )
