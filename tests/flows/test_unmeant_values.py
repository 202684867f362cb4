"""Values that cannot be meant are refused where they are read (issue 27 item 3): `validate` ends in
exit 2 and one line naming the file, the field and the value, never a traceback or a MemoryError."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from flows.cli import app
from tests.flows.test_bad_inputs import base_spec
from tests.infra.test_cpu_support import AVX512

REPO = Path(__file__).parents[2]
runner = CliRunner()
INF, NAN = float("inf"), float("nan")


def policy(**sections):
    """A change writing gates/policy.yaml with `sections` ({section: {key: value}}) merged in."""
    def change(spec: dict, tmp_path: Path) -> None:
        data = yaml.safe_load((REPO / "gates" / "policy.yaml").read_text())
        for section, values in sections.items():
            target = data[section]
            for key, value in values.items():
                if isinstance(value, dict):
                    target[key].update(value)
                else:
                    target[key] = value
        (tmp_path / "policy.yaml").write_text(yaml.safe_dump(data))
        spec["gate_policy"] = str(tmp_path / "policy.yaml")
    return change


def profile(**values):
    """A change writing the ci load profile with `values` changed ({key: None} removes one)."""
    def change(spec: dict, tmp_path: Path) -> None:
        data = yaml.safe_load((REPO / "load" / "profiles" / "ci.yaml").read_text())
        for key, value in values.items():
            if value is None:
                data.pop(key)
            elif isinstance(value, dict):
                data.setdefault(key, {}).update(value)
            else:
                data[key] = value
        (tmp_path / "profile.yaml").write_text(yaml.safe_dump(data))
        spec["load_profile"] = str(tmp_path / "profile.yaml")
    return change


ROWS = [{"id": f"r{i}", "prompt": f"What is {i} + 1?", "answer": i + 1} for i in range(40)]


def user_set(scorer: dict, rows: list | None = None, text: str | None = None, name: str = "own",
             file: str = "data.jsonl"):
    """A change adding a user set over a JSONL file of `rows` (or raw `text`)."""
    def change(spec: dict, tmp_path: Path) -> None:
        path = tmp_path / file
        path.write_text(text if text is not None else
                        "".join(json.dumps(row) + "\n" for row in (rows or ROWS)))
        spec["evalsets"].append({"name": name, "path": str(path), "scorer": scorer})
    return change


def both(*changes):
    def change(spec: dict, tmp_path: Path) -> None:
        for one in changes:
            one(spec, tmp_path)
    return change


def engine(**values):
    return lambda spec, tmp_path: spec.update(engine=values)


NUMERIC = {"kind": "numeric", "field": "answer"}
LAUGHS = "".join(f"l{level}: &l{level} [{', '.join([f'*l{level - 1}'] * 9)}]\n"
                 for level in range(1, 10))
BOMB = "l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + LAUGHS


def billion_laughs(spec: dict, tmp_path: Path) -> None:
    spec[APPEND] = BOMB  # written after the spec as text: nine levels of nine aliases each


APPEND = "__text_after__"


# (case, change, what the one line must say)
CASES = [
    ("policy seed -1", policy(quality={"seed": -1}),
     "field 'quality.seed': Input should be greater than or equal to 0 (got -1)"),
    ("policy 10^8 bootstrap resamples", policy(quality={"bootstrap_resamples": 100_000_000}),
     "field 'quality.bootstrap_resamples': at most 100,000 (the Monte Carlo error"),
    ("policy max_kl .inf", policy(tolerances={"8bit": {"max_kl": INF}}),
     "field 'tolerances.8bit.max_kl': Input should be a finite number (got inf); give a finite"),
    ("policy perplexity limit .inf", policy(perplexity={"max_increase_vs_parent": INF}),
     "field 'perplexity.max_increase_vs_parent': Input should be a finite number (got inf)"),
    ("policy latency limit .nan", policy(latency={"max_tpot_p50_increase": NAN}),
     "field 'latency.max_tpot_p50_increase': Input should be a finite number (got nan)"),
    ("policy latency limit 1e9 (a switch-off)", policy(latency={"max_ttft_p50_increase": 1e9}),
     "field 'latency.max_ttft_p50_increase': at most 10 (a larger allowance (over x11) lets "
     "every regression through"),
    ("policy confidence .nan", policy(quality={"confidence": NAN}),
     "field 'quality.confidence': Input should be a finite number (got nan)"),
    ("policy min_items above the set", policy(quality={"min_items": 5000}),
     "quality.min_items (5000) is more than eval set 'math' (1040 items) holds: every stage "
     "would fail closed on it"),
    ("policy latency.level typo", policy(latency={"level": "lwo"}),
     "field 'latency.level': level 'lwo': did you mean 'low'? (valid: high, low) (got 'lwo')"),
    ("profile duration .inf", profile(requests=None, warmup_requests=None, duration_s=INF),
     "field 'duration_s': Input should be a finite number (got inf)"),
    ("profile duration 1e18 s", profile(requests=None, warmup_requests=None, duration_s=1e18),
     "field 'duration_s': at most 86,400 s (a day: a longer wait cannot be meant; set soak: true "
     "to ask for up to 30 days); give a smaller value (got 1e+18)"),
    ("profile request timeout 1e18 s", profile(request_timeout_s=1e18),
     "field 'request_timeout_s': at most 86,400 s"),
    ("profile capacity max_rate .inf", profile(capacity={"max_rate": INF}),
     "field 'capacity.max_rate': Input should be a finite number (got inf)"),
    ("profile capacity min_rate 1e-12", profile(capacity={"min_rate": 1e-12}),
     "capacity: min_rate 1e-12 req/s would measure min_requests (20) for 20,000,000,000,000 s"),
    ("profile 1e9 warm-up requests", profile(warmup_requests=1_000_000_000),
     "field 'warmup_requests': at most 1,000,000 (more cannot be meant in one run); give a "
     "smaller value (got 1000000000)"),
    ("profile requests longer than the context", profile(prompt_tokens=4000, output_tokens=200),
     "profile.yaml: prompt_tokens (4000) + output_tokens (200) = 4200 tokens per request, but "
     "engine.max_model_len is 4096"),
    ("spec startup timeout .inf", engine(startup_timeout_s=INF),
     "field 'engine.vllm.startup_timeout_s': Input should be a finite number (got inf)"),
    ("spec startup timeout 1e18 s", engine(startup_timeout_s=1e18),
     "field 'engine.vllm.startup_timeout_s': at most 86,400 s"),
    ("spec kv cache .nan", engine(kv_cache_space_gib=NAN),
     "field 'engine.vllm.kv_cache_space_gib': Input should be a finite number (got nan)"),
    ("spec kv cache beyond the box", engine(kv_cache_space_gib=10**9),
     "kv_cache_space_gib 1e+09 is more than this machine's memory"),
    ("spec billion laughs", billion_laughs,
     "expand the document by more than 100,000 nodes (a 'billion laughs')"),
    ("user set reference Infinity", user_set(NUMERIC, text='{"id": 1, "prompt": "p", '
                                             '"answer": Infinity}\n'),
     "data.jsonl:1: Infinity is not a JSON number; write a finite number"),
    ("user set reference 'nan'", user_set(NUMERIC, rows=[*ROWS[:3], {**ROWS[3], "answer": "nan"}]),
     "data.jsonl:4: field 'answer' (id 'r3'): 'nan' is not a finite number"),
    ("numeric tolerance .inf", user_set({**NUMERIC, "tolerance": INF}),
     "field 'evalsets.1.scorer.numeric.tolerance': Input should be a finite number (got inf)"),
    ("numeric relative 1e6", user_set({**NUMERIC, "relative": 1e6}),
     "field 'evalsets.1.scorer.numeric.relative': at most 1 (above 1 an answer of the wrong "
     "sign scores right); give a smaller value (got 1000000.0)"),
    ("user sets differing in case", both(user_set(NUMERIC, name="Own"),
                                         user_set(NUMERIC, name="own", file="other.jsonl")),
     "evalsets: 'Own' and 'own' differ only in case"),
    ("one data file under two names", both(user_set(NUMERIC, name="own"),
                                           user_set(NUMERIC, name="again")),
     "evalsets: 'own' and 'again' are the same data"),
    ("regex scorer (a+)+$", user_set({"kind": "regex", "pattern": "(a+)+$"}),
     "evalsets.1.scorer.regex: pattern '(a+)+$' nests a repeat inside a repeat"),
    ("row regex (x+)*y", user_set({"kind": "regex", "field": "pattern"},
                                  rows=[{"id": 1, "prompt": "p", "pattern": "(x+)*y"}]),
     "data.jsonl:1: field 'pattern' (id '1'): pattern '(x+)*y' nests a repeat"),
    ("JSONL row with a key twice", user_set(NUMERIC, text='{"id": 1, "prompt": "p", "answer": 2, '
                                            '"answer": 3}\n'),
     "data.jsonl:1: key 'answer' is given twice in one object"),
    ("json schema with a remote $ref",
     user_set({"kind": "json", "schema": {"$ref": "https://example.com/s.json"}}),
     "evalsets.1.scorer.json: 'schema': $ref 'https://example.com/s.json' is not local"),
    ("row schema with a relative $ref",
     user_set({"kind": "json", "schema_field": "schema"},
              rows=[{"id": 1, "prompt": "p", "schema": {"$ref": "other.json#/a"}}]),
     "data.jsonl:1: field 'schema' (id '1'): $ref 'other.json#/a' is not local"),
]


def validate(tmp_path: Path, spec: dict):
    path = tmp_path / "spec.yaml"
    after = spec.pop(APPEND, "")
    path.write_text(yaml.safe_dump(spec) + after)
    return runner.invoke(app, ["validate", str(path)], env={"COLUMNS": "400"})


@pytest.mark.parametrize("change, expected", [case[1:] for case in CASES],
                         ids=[case[0] for case in CASES])
def test_validate_refuses_what_cannot_be_meant_in_one_line(tmp_path, monkeypatch, change, expected):
    monkeypatch.setattr("flows.preflight.cpu_flags", lambda: AVX512)
    spec = base_spec(tmp_path)
    change(spec, tmp_path)
    result = validate(tmp_path, spec)
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2, result.output
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert expected in lines[0], lines[0]
    assert "Traceback" not in result.output


@pytest.mark.parametrize("rate", ["inf", "1e400"])
def test_whatif_refuses_an_infinite_rate(rate):
    result = runner.invoke(app, ["whatif", "nowhere", "--rate", rate])
    assert result.exit_code == 2
    assert result.output.strip() == "error: --rate must be a finite number above 0 req/s, got inf"


def test_the_shipped_policy_profiles_and_specs_still_load():
    from flows.spec import load_spec
    from gates.policy import load_policy
    from load.profile import bundled_profiles, load_profile

    assert load_policy("default").quality.bootstrap_resamples == 2000
    for path in (REPO / "gates").glob("policy-*.yaml"):  # the shipped ones that extend it
        assert load_policy(str(path)) != load_policy("default"), path
    profiles = {name: load_profile(name) for name in bundled_profiles()}
    assert {"ci", "demo"} <= set(profiles)
    specs = sorted((REPO / "flows" / "specs").glob("*.yaml"))
    assert specs
    for path in specs:
        spec = load_spec(path)
        used = profiles[spec.load_profile]
        used.check_fits(spec.engine.max_model_len, spec.load_profile)  # they meet at validate


def test_the_good_user_set_of_the_table_reaches_the_power_check(tmp_path, monkeypatch):
    """The user-set rows above are fine apart from the one damage each case makes."""
    monkeypatch.setattr("flows.preflight.cpu_flags", lambda: AVX512)
    spec = base_spec(tmp_path)
    user_set(NUMERIC)(spec, tmp_path)
    result = validate(tmp_path, spec)
    assert result.exit_code == 2 and "eval sets too small for the accuracy gate" in result.output
