"""Run the locustfile once per concurrency level and turn its raw samples into a LoadResult."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from infra.errors import MeasurementError
from load.profile import LoadProfile
from load.results import LoadResult, LoadSample, LoadSummary

LOCUSTFILE = Path(__file__).parent / "locustfile.py"
# Locust runs a little longer than warm-up + measured window, so the window's last moments
# still see requests start; those started after it are dropped like the warm-up ones.
RUN_MARGIN_S = 2
STARTUP_ALLOWANCE_S = 60
PERCENTILES = (50, 90, 99)


def run_load(base_url: str, model: str, profile: LoadProfile, out_dir: Path) -> LoadResult:
    """Load the server at each level of the profile; raw samples and summaries land in out_dir."""
    out_dir.mkdir(parents=True, exist_ok=True)
    result = LoadResult()
    for level, users in profile.levels().items():
        samples = run_level(base_url, model, profile, level, users, out_dir)
        measured = measured_window(samples, profile.warmup_s, profile.duration_s)
        if not measured:
            # Fail closed: an empty window would otherwise read as "no errors, no latency".
            raise MeasurementError(
                f"{level}: none of {len(samples)} requests started inside the measured window "
                f"({profile.warmup_s}s warm-up, then {profile.duration_s}s); requests take "
                f"longer than the window: raise duration_s or shrink output_tokens"
            )
        check_equal_work(measured, profile.output_tokens, level)
        result.samples[level] = measured
        result.summaries[level] = summarize(measured, level, users, profile.duration_s)
    result.save(out_dir)
    return result


def run_level(
    base_url: str, model: str, profile: LoadProfile, level: str, users: int, out_dir: Path
) -> list[LoadSample]:
    """One headless Locust run; returns every raw sample, warm-up included."""
    out_dir.mkdir(parents=True, exist_ok=True)
    samples_path = out_dir / f"samples_{level}.jsonl"
    log_path = out_dir / f"locust_{level}.log"
    samples_path.unlink(missing_ok=True)
    run_s = math.ceil(profile.warmup_s + profile.duration_s) + RUN_MARGIN_S
    stop_timeout_s = math.ceil(profile.request_timeout_s)
    command = [
        sys.executable, "-m", "locust",
        "-f", str(LOCUSTFILE),
        "--headless", "--only-summary",
        "-u", str(users), "-r", str(users),
        "-t", f"{run_s}s",
        "--stop-timeout", str(stop_timeout_s),
        "--host", base_url.rstrip("/"),
        "--csv", str(out_dir / f"locust_{level}"),
        "--html", str(out_dir / f"locust_{level}.html"),
        # Failed requests are data for the gates, not a reason for a non-zero exit.
        "--exit-code-on-error", "0",
    ]  # fmt: skip
    env = os.environ | {
        "QG_MODEL": model,
        "QG_PROMPT_TOKENS": str(profile.prompt_tokens),
        "QG_OUTPUT_TOKENS": str(profile.output_tokens),
        "QG_SEED": str(profile.seed),
        "QG_LEVEL": level,
        "QG_TIMEOUT_S": str(profile.request_timeout_s),
        "QG_SAMPLES_FILE": str(samples_path),
    }
    timeout_s = run_s + stop_timeout_s + STARTUP_ALLOWANCE_S
    with open(log_path, "w", encoding="utf-8") as log:
        log.write(f"$ {' '.join(command)}\n")
        log.flush()
        try:
            completed = subprocess.run(
                command, stdout=log, stderr=subprocess.STDOUT, env=env, timeout=timeout_s
            )
        except subprocess.TimeoutExpired as exc:
            raise MeasurementError(
                f"locust ({level}, {users} users) ran past {timeout_s}s; log {log_path}:\n{_tail(log_path)}"
            ) from exc
    if completed.returncode != 0:
        raise MeasurementError(
            f"locust ({level}, {users} users) exited with {completed.returncode}; "
            f"log {log_path}:\n{_tail(log_path)}"
        )
    samples = read_samples(samples_path)
    if not samples:
        raise MeasurementError(
            f"locust ({level}, {users} users) recorded no requests; log {log_path}:\n{_tail(log_path)}"
        )
    return samples


def read_samples(path: Path) -> list[LoadSample]:
    """The JSON lines the locustfile wrote; a missing file is no samples."""
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    return [LoadSample.model_validate_json(line) for line in lines if line.strip()]


def measured_window(samples: Sequence[LoadSample], warmup_s: float, duration_s: float) -> list[LoadSample]:
    """Samples that started inside the measured window, which opens warmup_s after the first."""
    if not samples:
        return []
    opens = min(s.start_s for s in samples) + warmup_s
    closes = opens + duration_s
    return [s for s in samples if opens <= s.start_s < closes]


def check_equal_work(samples: Sequence[LoadSample], output_tokens: int, level: str) -> None:
    """Every stage must do the same work; an engine that stops early makes timings incomparable."""
    short = [s.output_tokens for s in samples if s.error is None and s.output_tokens != output_tokens]
    if short:
        raise MeasurementError(
            f"{level}: {len(short)} requests returned {sorted(set(short))} output tokens instead "
            f"of {output_tokens}; does the engine honour ignore_eos and max_tokens?"
        )


def summarize(samples: Sequence[LoadSample], level: str, users: int, window_s: float) -> LoadSummary:
    """Percentiles and rates of one level's measured samples (pure; window_s > 0)."""
    if window_s <= 0:
        raise ValueError(f"window_s must be > 0, got {window_s}")
    ok = [s for s in samples if s.error is None]
    errors = len(samples) - len(ok)
    figures: dict[str, float | None] = {}
    series = {
        "ttft": [s.ttft_ms for s in ok if s.ttft_ms is not None],
        "tpot": [s.tpot_ms for s in ok if s.tpot_ms is not None],
        "itl": [gap for s in ok for gap in s.itl_ms],
        "e2e": [s.e2e_ms for s in ok if s.e2e_ms is not None],
    }
    for name, values in series.items():
        points = np.percentile(values, PERCENTILES) if values else [None] * len(PERCENTILES)
        for pct, value in zip(PERCENTILES, points, strict=True):
            figures[f"{name}_p{pct}_ms"] = None if value is None else float(value)
    return LoadSummary(
        level=level,
        users=users,
        requests=len(samples),
        errors=errors,
        error_rate=errors / len(samples) if samples else 0.0,
        duration_s=window_s,
        requests_per_s=len(ok) / window_s,
        output_tokens_per_s=sum(s.output_tokens for s in ok) / window_s,
        **figures,
    )


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
