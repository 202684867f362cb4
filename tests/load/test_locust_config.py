"""load/locust_config.py: the locustfile's one configuration, through the environment and back."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from load.arrivals import Arrivals
from load.launch import LOCUSTFILE, locust_env
from load.locust_config import LocustConfig, env_name
from load.profile import LoadProfile
from load.stream_timing import StreamTimes

PROFILE = LoadProfile(low_users=1, high_users=2, prompt_tokens=16, output_tokens=5, requests=4,
                      warmup_requests=0, request_timeout_s=10, seed=5)


def test_a_config_round_trips_through_the_environment() -> None:
    config = LocustConfig(model="m", prompt_tokens=7, output_tokens=3, seed=9, level="high",
                          prompt_salt="kept", timeout_s=2.5, max_requests=11, rate=0.75,
                          arrivals_for_s=30.0, total_users=4, master_run_s=60.0, token_id_min=5,
                          token_id_max=50, samples_file="/tmp/s.jsonl",
                          request_body={"response_format": {"type": "json_object"}},
                          prompts_file="/tmp/p.jsonl")
    env = config.to_env()
    assert all(name.startswith("QG_") and isinstance(value, str) for name, value in env.items())
    assert LocustConfig.from_env(env) == config


def test_an_empty_environment_gives_the_defaults() -> None:
    assert LocustConfig.from_env({}) == LocustConfig()
    assert LocustConfig.from_env({"QG_REQUEST_BODY": ""}).request_body == {}
    assert LocustConfig().timeout_s == 120.0 and LocustConfig().token_id_max == 40000


def test_locust_env_writes_every_variable_the_locustfile_reads() -> None:
    env = locust_env("m", PROFILE, "low", Path("/tmp/s.jsonl"), 2, rate=1.5, salt="x")
    config = LocustConfig.from_env(env)
    assert set(env) == {env_name(name) for name in LocustConfig.__dataclass_fields__}
    assert (config.model, config.level, config.prompt_salt, config.rate) == ("m", "low", "x", 1.5)
    assert (config.timeout_s, config.total_users, config.samples_file) == (10.0, 2, "/tmp/s.jsonl")
    assert env["QG_PROMPTS_FILE"] == "" and env["QG_REQUEST_BODY"] == "{}"


def test_the_locustfile_imports_by_path_from_anywhere(tmp_path: Path) -> None:
    # As Locust loads it: by path, its folder and the working directory on sys.path, no PYTHONPATH.
    code = ("import importlib.util, sys\n"
            f"sys.path.insert(0, {str(LOCUSTFILE.parent)!r})\n"
            f"spec = importlib.util.spec_from_file_location('locustfile', {str(LOCUSTFILE)!r})\n"
            "module = importlib.util.module_from_spec(spec)\n"
            "spec.loader.exec_module(module)\n"
            "print(module.CONFIG.model, module.CONFIG.rate, module.STREAM)\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {
        "QG_MODEL": "served", "QG_RATE": "2.0", "QG_LEVEL": "low", "QG_PROMPT_SALT": "s"}
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["served", "2.0", "s/low"]


def test_arrivals_follow_a_seeded_schedule_and_end() -> None:
    one, two = Arrivals(10.0, "seed", 100.0, for_s=1.0), Arrivals(10.0, "seed", 100.0, for_s=1.0)
    times = list(iter(one.take, None))
    assert times == list(iter(two.take, None)) and times[0] == 100.0
    assert all(b > a for a, b in zip(times, times[1:], strict=False)) and times[-1] <= 101.0


def test_stream_times_give_ttft_gaps_and_the_end() -> None:
    times = StreamTimes(10.0)
    for now in (10.1, 10.15, 10.25):
        times.token(now)
    times.end = 10.3
    sample = times.sample(1000.0)
    assert round(sample["ttft_ms"], 6) == 100.0 and [round(g, 6) for g in sample["itl_ms"]] == [50.0, 100.0]
    assert round(sample["e2e_ms"], 6) == 300.0 and sample["output_tokens"] == 3 and sample["error"] is None
