"""Property-based fuzzing of every input a user hands quantgate (Hypothesis).

Malformed specs, eval rows, gate policies, load profiles and stored results must end in exit 2
with one line and no traceback (or, where the damage leaves the input valid, in a normal answer);
nothing is written outside the folders the test gave; no damaged run is ever gated as go.
The example counts are bounded (FUZZ_EXAMPLES per property) so `make test` stays quick.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from flows.cli import app
from tests.flows.test_cli import stored_run

FUZZ_EXAMPLES = 100
runner = CliRunner()
FUZZ = settings(max_examples=FUZZ_EXAMPLES, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])

scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
                    st.sampled_from(["", "../..", "/etc", "[x]", "auto", "fp8", "-1", "NaN",
                                     "http://", "--api-key", "\u00e9\u0000"]))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=6)


def paths_of(data, prefix=()):
    """Every (path, value) in a JSON-like tree."""
    yield prefix, data
    if isinstance(data, dict):
        for key, value in data.items():
            yield from paths_of(value, (*prefix, key))
    elif isinstance(data, list):
        for index, value in enumerate(data):
            yield from paths_of(value, (*prefix, index))


@st.composite
def damaged(draw, tree):
    """`tree` with one to three edits: a value replaced, a key removed or an unknown key added."""
    tree = copy.deepcopy(tree)
    for _ in range(draw(st.integers(1, 3))):
        path, _value = draw(st.sampled_from(list(paths_of(tree))))
        if not path:
            continue
        parent = tree
        for part in path[:-1]:
            parent = parent[part]
        action = draw(st.sampled_from(["replace", "remove", "add"]))
        if action == "replace":
            parent[path[-1]] = draw(values)
        elif action == "remove":
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[draw(st.text(min_size=1, max_size=8))] = draw(values)
    return tree


def one_error_line(result) -> None:
    """Exit 2, one `error:` line, no traceback."""
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2, result.output
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert "Traceback" not in result.output


def files_under(folder: Path) -> set[Path]:
    return {path for path in folder.rglob("*")}


@FUZZ
@given(data=st.data())
def test_a_damaged_spec_is_one_line_or_valid_and_never_runs(workspace, data):
    root, spec = workspace
    path = root / "spec.yaml"
    text = data.draw(st.one_of(
        damaged(spec).map(yaml.safe_dump),
        st.binary(max_size=40).map(lambda b: b.decode("latin-1")),
        st.just(yaml.safe_dump(spec)).map(lambda t: t + "stages: []\n")))  # a repeated key
    path.write_text(text, encoding="utf-8", errors="surrogateescape")
    before = files_under(root)
    result = runner.invoke(app, ["validate", str(path)], env={"COLUMNS": "300"})
    assert result.exit_code in (0, 2), result.output
    if result.exit_code == 2:
        one_error_line(result)
        run = runner.invoke(app, ["run", str(path)], env={"COLUMNS": "300"})
        one_error_line(run)  # the same refusal, before Prefect or any engine
    assert files_under(root) - before <= {root / "runs", root / "reports"}


BUSINESS_ROW = {"id": "b1", "group": "json", "scorer": "json",
                "prompt": "Return JSON with key n.", "reference": "{\"n\": 1}",
                "schema": "{\"type\": \"object\", \"required\": [\"n\"]}"}


@FUZZ
@given(rows=st.lists(damaged(BUSINESS_ROW), min_size=1, max_size=4),
       raw=st.sampled_from([b"", b"\xff\xfe not utf-8\n", b"{not json\n", b"[1, 2]\n"]))
def test_damaged_eval_rows_are_refused_by_file_line_or_pass(workspace, monkeypatch, rows, raw):
    from evalsets.contracts import validate_set
    from evalsets.spec import EvalSetInfo, EvalSetSpec
    from infra.errors import SpecError

    root, _spec = workspace
    folder = root / "business"
    if not folder.exists():
        shipped = EvalSetSpec(name="business").info.folder
        shutil.copytree(shipped, folder, ignore=shutil.ignore_patterns("__pycache__", "*.jsonl"))
    body = b"".join(json.dumps(row).encode() + b"\n" for row in rows) + raw
    (folder / "data.jsonl").write_bytes(body)
    monkeypatch.setattr(EvalSetSpec, "info", property(lambda self: EvalSetInfo("business", folder)))
    try:  # a copy outside evalsets/ is a user's folder: its row checker runs as at `run`
        validate_set(EvalSetSpec(name="business"), run_checks=True)
    except SpecError as err:
        assert "\n" not in str(err) and "data.jsonl" in str(err)


POLICY = yaml.safe_load((Path(__file__).parents[2] / "gates" / "policy.yaml").read_text())
PROFILE = yaml.safe_load((Path(__file__).parents[2] / "load" / "profiles" / "ci.yaml").read_text())


@FUZZ
@given(policy=damaged(POLICY), profile=damaged(PROFILE))
def test_damaged_policies_and_profiles_are_one_line(workspace, policy, profile):
    root, spec = workspace
    (root / "policy.yaml").write_text(yaml.safe_dump(policy))
    (root / "profile.yaml").write_text(yaml.safe_dump(profile))
    path = root / "spec.yaml"
    path.write_text(yaml.safe_dump(spec | {"gate_policy": str(root / "policy.yaml"),
                                           "load_profile": str(root / "profile.yaml")}))
    result = runner.invoke(app, ["validate", str(path)], env={"COLUMNS": "300"})
    assert result.exit_code in (0, 2), result.output
    if result.exit_code == 2:
        one_error_line(result)


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    return stored_run(tmp_path_factory.mktemp("stored") / "run")


@FUZZ
@given(which=st.sampled_from(["manifest.json", "w/stage.json", "baseline/stage.json"]),
       data=st.data())
def test_damaged_stored_results_never_gate_as_go_unless_still_valid(workspace, stored, which,
                                                                     data):
    from gates.record import RunManifest, StageRecord

    root, _spec = workspace
    run = root / "run"
    shutil.rmtree(run, ignore_errors=True)
    shutil.copytree(stored, run)
    target = run / which
    original = json.loads(target.read_text())
    target.write_text(json.dumps(data.draw(damaged(original)), allow_nan=True))
    before = files_under(root)
    result = runner.invoke(app, ["gate", str(run)], env={"COLUMNS": "300"})
    assert result.exit_code in (0, 1, 2), result.output
    if result.exit_code == 2:
        one_error_line(result)
    else:  # an answer only from records that still read as valid, of this run only
        manifest = RunManifest.model_validate_json((run / "manifest.json").read_text())
        assert all((run / stage).resolve().parent == run.resolve() for stage in manifest.stages)
        for stage in manifest.stages:
            StageRecord.read(run / stage)
    assert files_under(root) - before <= {run / "verdict.json"}
