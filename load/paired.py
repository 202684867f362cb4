"""Time a stage against its reference in interleaved rounds, both servers up at once."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from infra.contention import others_share, sample
from infra.cores import CorePlan
from load.profile import LoadProfile
from load.results import LoadResult, LoadSample, PairedLoad, PairedRound, Side
from load.runner import WARMUP, check_equal_work, find_capacity, measured_part, run_level
from load.stats import pool_repeats


@dataclass(frozen=True)
class Server:
    """An OpenAI-compatible server under load."""

    base_url: str
    model: str
    request_body: dict | None = None  # fields every request adds (structured_output stage)
    local: bool = False  # started by this process: its CPU is ours, not contention


def round_order(index: int) -> tuple[Side, Side]:
    """A B, B A, A B, ...: the side that runs first alternates, so order effects cancel."""
    return ("reference", "stage") if index % 2 == 0 else ("stage", "reference")


def round_profile(profile: LoadProfile) -> LoadProfile:
    """One side of one round: a short request-count run in one process."""
    return profile.model_copy(update={
        "requests": profile.round_requests, "warmup_requests": profile.round_warmup_requests,
        "duration_s": None, "workers": 0, "repeats": 1,
    })


def run_paired_load(
    stage: Server,
    reference: Server,
    reference_name: str,
    profile: LoadProfile,
    out_dir: Path,
    *,
    reference_command: str | None = None,
    cores: CorePlan | None = None,
    salt: str = "",
    more_rounds: Callable[[PairedLoad, str], bool] | None = None,
) -> tuple[LoadResult, PairedLoad]:
    """Per level, `profile.rounds` rounds of the same load against both servers, back to back.

    Returns the stage's own LoadResult (its rounds pooled, per-round summaries as repeats, then
    the capacity search if the profile enables it) and the paired rounds the latency gate judges.
    Raw files land in out_dir/stage and out_dir/reference (same tags: a round's two sides got the
    same prompts); load.json and paired.json in out_dir. Locust runs on the client cores of
    `cores` (both engines are bound to the same engine cores, one of them loaded at a time).
    `salt` (the stage's name) gives the rounds prompt streams of their own: a reference the run
    kept up has already answered the unsalted ones, which would hit its prefix cache.
    `more_rounds(paired, level)`, asked after each of a level's rounds from the profile's count
    on, adds another round while it says so (the latency rule unresolved, within its budget).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    cores = cores or CorePlan.unplanned()
    one_side = round_profile(profile)
    servers = {"reference": reference, "stage": stage}
    result = LoadResult(max_error_rate=profile.max_error_rate)
    result.record_cores(cores)
    paired = PairedLoad(reference=reference_name, reference_command=reference_command,
                        requests_per_round=profile.round_requests)
    # A freshly started reference is cold (first shapes, caches) while the stage has just
    # answered its eval sets: warm both at the busiest level before any round counts.
    levels = profile.levels()
    warm = one_side.model_copy(update={"requests": max(users for users in levels.values()) * 2,
                                       "warmup_requests": 0})
    for side, server in servers.items():
        run_level(server.base_url, server.model, warm, WARMUP, max(levels.values()),
                  out_dir / side, cores=cores, request_body=server.request_body, salt=salt)
    for level, users in levels.items():
        rounds: list[PairedRound] = []
        windows: list[float] = []
        index = 0
        while index < profile.rounds or (more_rounds is not None and more_rounds(paired, level)):
            measured: dict[Side, list[LoadSample]] = {}
            before = sample()
            for side in round_order(index):
                server = servers[side]
                samples = run_level(server.base_url, server.model, one_side, level, users,
                                    out_dir / side, repeat=index, cores=cores,
                                    request_body=server.request_body, salt=salt)
                measured[side], window_s = measured_part(samples, one_side, level)
                check_equal_work(measured[side], profile.output_tokens, f"{level} ({side})")
                if side == "stage":
                    windows.append(window_s)
            # Both engines are this run's own: what the rest of the box took is contention.
            share = others_share(before, sample()) if stage.local and reference.local else None
            rounds.append(PairedRound(index=index, first=round_order(index)[0],
                                      reference=measured["reference"], stage=measured["stage"],
                                      others_cpu_share=share))
            paired.rounds[level] = rounds
            index += 1
        pooled, each = pool_repeats([r.stage for r in rounds], windows, level, users, profile.slo)
        result.samples[level] = [s for r in rounds for s in r.stage]
        result.summaries[level] = pooled
        result.repeat_summaries[level] = each
    if profile.capacity.enabled:
        started = time.monotonic()
        capacity, note, trace = find_capacity(stage.base_url, stage.model, profile,
                                              out_dir / "stage", cores, levels=result.summaries,
                                              request_body=stage.request_body)
        result.capacity_rps, result.capacity_note, result.capacity_trace = capacity, note, trace
        result.capacity_s = round(time.monotonic() - started, 2)
    result.save(out_dir)
    paired.save(out_dir)
    return result, paired
