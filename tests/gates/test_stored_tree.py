"""Stored records that do not make one run's tree, or that lack what their layout promises, are
refused in one line naming the file, the field and the value; never judged, hung on or traced."""

from __future__ import annotations

import contextlib
import json
import signal
from collections.abc import Iterator

import pytest
from typer.testing import CliRunner

from flows.cli import app
from gates.decide import decide, load_records
from gates.policy import GatePolicy
from gates.record import RunManifest
from infra.errors import QuantgateError
from tests.gates.records import record

SCORES = [1.0] * 30 + [0.0] * 30
CHAIN = (("baseline", None), ("w", "baseline"), ("a", "w"))
runner = CliRunner()


class Hung(Exception):
    pass


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """A bound on the block: a loop that never ends fails the test instead of the suite."""
    def stop(signum, frame):
        raise Hung(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def stored_run(folder, stages=CHAIN):
    for name, parent in stages:
        record(name, parent, SCORES).save(folder / name)
    RunManifest(candidate="c", stages=[name for name, _ in stages]).save(folder)
    return folder


def edit(path, change):
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def gate(run) -> tuple[int, list[str]]:
    with deadline(60):
        result = runner.invoke(app, ["gate", str(run)], env={"COLUMNS": "400"})
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        repr(result.exception))
    return result.exit_code, [line for line in result.output.splitlines() if line.strip()]


def refused(run) -> str:
    """The one error line of `gate` on the run, exit 2: neither a go (0) nor a rollback (1); the
    run folder is left as it was."""
    before = {path: path.stat().st_mtime_ns for path in run.rglob("*")}
    code, lines = gate(run)
    assert code == 2, lines
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert {path: path.stat().st_mtime_ns for path in run.rglob("*")} == before
    return lines[0]


def test_the_intact_run_gates(tmp_path):
    code, lines = gate(stored_run(tmp_path))
    assert code == 0, lines


def test_a_stage_that_is_its_own_parent_is_refused_not_hung_on(tmp_path):
    run = stored_run(tmp_path)
    edit(run / "a" / "stage.json", lambda data: data.update(parent="a"))
    assert refused(run) == (f"error: {run / 'a' / 'stage.json'}: parent 'a' is the stage itself; "
                            "a stage is judged against one before it: set parent to one of "
                            "'baseline', 'w'")


def test_two_stages_that_are_each_others_parent_are_refused_naming_the_cycle(tmp_path):
    run = stored_run(tmp_path)
    edit(run / "w" / "stage.json", lambda data: data.update(parent="a"))
    line = refused(run)
    assert line.startswith(f"error: {run / 'w' / 'stage.json'}: parent 'a' makes a cycle "
                           "('w' -> 'a' -> 'w')"), line
    assert line.endswith("set parent to 'baseline'"), line


def test_a_missing_parent_is_one_line_with_the_closest_stage(tmp_path):
    run = stored_run(tmp_path)
    edit(run / "a" / "stage.json", lambda data: data.update(parent="ww"))
    assert refused(run) == (f"error: {run / 'a' / 'stage.json'}: parent 'ww' is not a stage of "
                            "this run: set parent to a stage before it; did you mean 'w'? (valid: "
                            "baseline, w)")


def test_a_reversed_stage_order_is_refused_not_judged_against_itself(tmp_path):
    run = stored_run(tmp_path, CHAIN[:2])
    edit(run / "manifest.json", lambda data: data.update(stages=["w", "baseline"]))
    assert refused(run) == (f"error: {run / 'manifest.json'}: stages ['w', 'baseline']: 'w' "
                            "(parent 'baseline') is listed first, not the baseline 'baseline': "
                            "list the baseline first, each stage after its parent")


def test_a_child_listed_before_its_parent_is_refused(tmp_path):
    run = stored_run(tmp_path)
    edit(run / "manifest.json", lambda data: data.update(stages=["baseline", "a", "w"]))
    line = refused(run)
    assert line == (f"error: {run / 'manifest.json'}: stages ['baseline', 'a', 'w']: 'a' is "
                    "listed before its parent 'w': list the baseline first, each stage after its "
                    "parent"), line


@pytest.mark.parametrize(("stage", "change", "expected"), [
    ("baseline", {"kind": "weights"}, "kind 'weights' with no parent: the first stage is the "
     "run's baseline, of kind 'baseline'; set kind to 'baseline'"),
    ("w", {"parent": None}, "parent null (kind 'weights'), but 'baseline' is the run's baseline: "
     "set parent to 'baseline'"),
    ("w", {"kind": "baseline"}, "kind 'baseline' with parent 'baseline'; only the first stage is "
     "the baseline"),
    ("w", {"kind": "weight"}, "kind 'weight' is not a stage kind, did you mean 'weights'?"),
    ("w", {"name": "a"}, "name 'a' but its folder and manifest entry are 'w'"),
])
def test_a_record_that_contradicts_the_run_is_refused_naming_its_field(tmp_path, stage, change,
                                                                      expected):
    run = stored_run(tmp_path)
    edit(run / stage / "stage.json", lambda data: data.update(change))
    line = refused(run)
    assert line.startswith(f"error: {run / stage / 'stage.json'}: {expected}"), line


def test_a_stage_listed_twice_is_refused(tmp_path):
    run = stored_run(tmp_path)
    edit(run / "manifest.json", lambda data: data.update(stages=["baseline", "w", "w", "a"]))
    assert refused(run) == (f"error: {run / 'manifest.json'}: stage 'w' is listed twice in "
                            "stages; the manifest is damaged: re-run the acceptance")


def test_a_stage_folder_the_manifest_leaves_out_is_refused(tmp_path):
    run = stored_run(tmp_path)
    (run / "a" / "stage.json").write_text(
        record("a", "w", [0.0] * 60).model_dump_json())  # the failing stage...
    edit(run / "manifest.json", lambda data: data.update(stages=["baseline", "w"]))  # ...left out
    line = refused(run)
    assert line.startswith(f"error: {run / 'manifest.json'}: stages ['baseline', 'w'] leave out "
                           "the stage folder 'a' of this run"), line


@pytest.mark.parametrize("candidate", ["[bold]x[/]", "[/]"])
def test_a_candidate_name_with_markup_is_one_line_not_a_markup_error(tmp_path, candidate):
    run = stored_run(tmp_path)
    edit(run / "manifest.json", lambda data: data.update(candidate=candidate))
    assert refused(run) == (f"error: {run / 'manifest.json'}: candidate {candidate!r} is not a "
                            "candidate name a spec allows ([A-Za-z0-9][A-Za-z0-9._-]*); the "
                            "manifest was edited or damaged: re-run the acceptance")


def test_a_nul_byte_in_a_manifest_entry_is_one_line(tmp_path):
    run = stored_run(tmp_path)
    edit(run / "manifest.json", lambda data: data.update(stages=["baseline", "w\x00", "a"]))
    line = refused(run)
    assert line.startswith(f"error: {run / 'manifest.json'}: stage entry 'w\\x00' is not a stage "
                           "folder of this run"), line


def test_comparability_deleted_from_every_record_is_refused_not_a_silent_go(tmp_path):
    run = stored_run(tmp_path)
    for name, _ in CHAIN:
        edit(run / name / "stage.json", lambda data: data.pop("comparability"))
    assert refused(run) == (
        f"error: {run / 'baseline' / 'stage.json'}: schema 2 record without 'comparability', "
        "which every StageRecord of this layout carries (null where nothing was measured) and "
        "the verdict reads; the record was edited or damaged: re-run the acceptance")


def test_comparability_null_in_a_finished_stage_is_refused_not_read_as_not_recorded(tmp_path):
    run = stored_run(tmp_path)
    edit(run / "w" / "stage.json", lambda data: data.update(comparability=None))
    assert refused(run) == (
        f"error: {run / 'w' / 'stage.json'}: comparability is null in a stage that finished "
        "(error is null); quantgate records what every measured stage was served, so the rule "
        "cannot be skipped: the record was edited or written by an older quantgate: re-run the "
        "acceptance")


def test_comparability_null_in_a_stage_that_did_not_finish_is_judged_a_failure(tmp_path):
    run = stored_run(tmp_path)
    edit(run / "a" / "stage.json", lambda data: data.update(comparability=None, error="died"))
    code, lines = gate(run)
    assert code == 1 and "ROLLBACK" in lines[1], lines


@pytest.mark.parametrize("field", ["emulated", "error", "facts", "comparability"])
def test_every_field_the_verdict_reads_must_be_in_the_record(tmp_path, field):
    run = stored_run(tmp_path)
    edit(run / "a" / "stage.json", lambda data: data.pop(field))
    line = refused(run)
    assert line.startswith(f"error: {run / 'a' / 'stage.json'}: schema 2 record without "
                           f"{field!r}"), line


@pytest.mark.parametrize("change", [
    lambda results: results.pop("quality"),  # a result left out
    lambda results: results.update(load="../w/load/load.json"),  # another stage's file
    lambda results: results.update(paired_load="load/load.json"),  # another result's file
    lambda results: results.update(extra="quality/quality.json"),
])
def test_a_stage_s_results_are_its_own_files_or_the_record_is_refused(tmp_path, change):
    run = stored_run(tmp_path)
    path = run / "a" / "stage.json"
    edit(path, lambda data: change(data["results"]))
    assert refused(run).startswith(f"error: {path}: 'results' is ")


def test_a_result_written_into_stage_json_is_refused_not_read_in_place_of_its_file(tmp_path):
    run = stored_run(tmp_path)
    path = run / "a" / "stage.json"
    good = json.loads((run / "w" / "quality" / "quality.json").read_text())  # 0 flips
    edit(path, lambda data: data.update(quality=good) or data["results"].update(quality=None))
    assert refused(run).startswith(f"error: {path}: schema 2 record with 'quality' inside it")


def test_a_result_said_unmeasured_is_judged_unmeasured_never_a_go(tmp_path):
    run = stored_run(tmp_path)
    edit(run / "a" / "stage.json", lambda data: data["results"].update(quality=None))
    code, lines = gate(run)  # its quality file is still there: the record says what was measured
    assert code == 1 and "ROLLBACK" in lines[1], lines


def test_a_result_file_taken_away_is_refused_not_judged_as_unmeasured(tmp_path):
    run = stored_run(tmp_path)
    (run / "a" / "quality" / "quality.json").unlink()
    assert refused(run).startswith(f"error: {run / 'a' / 'quality' / 'quality.json'}: missing")


def test_an_emulated_candidate_cannot_pass_by_losing_the_flag(tmp_path):
    run = stored_run(tmp_path)
    edit(run / "a" / "stage.json", lambda data: data.update(emulated=True))
    code, lines = gate(run)
    assert code == 1 and any("servable" in line for line in lines), lines  # the rule holds...
    edit(run / "a" / "stage.json", lambda data: data.pop("emulated"))
    assert "without 'emulated'" in refused(run)  # ...and its flag cannot be taken out


def test_load_records_refuses_what_gate_refuses(tmp_path):
    run = stored_run(tmp_path)
    edit(run / "w" / "stage.json", lambda data: data.update(parent="w"))
    with deadline(10), pytest.raises(QuantgateError, match=r"parent 'w' is the stage itself"):
        load_records(run)


@pytest.mark.parametrize(("parents", "expected"), [
    ({"w": "w"}, "stage 'w': parent 'w' is the stage itself"),
    ({"w": "a"}, "stage 'w': parent 'a' makes a cycle ('w' -> 'a' -> 'w')"),
    ({"a": "gone"}, "stage 'a': parent 'gone' is not a stage of this run"),
])
def test_decide_refuses_records_that_are_not_a_tree_instead_of_looping(parents, expected):
    records = [record(name, parent, SCORES) for name, parent in CHAIN]
    for stage in records:
        stage.parent = parents.get(stage.name, stage.parent)
    with deadline(10), pytest.raises(QuantgateError) as raised:
        decide("c", records, GatePolicy())
    assert str(raised.value).startswith(expected), raised.value


def test_decide_takes_no_stage_but_the_baseline_as_the_baseline():
    baseline, stage = (record(name, parent, SCORES) for name, parent in CHAIN[:2])
    with pytest.raises(QuantgateError, match=r"^stages \['w', 'baseline'\]: 'w' \(parent "
                       r"'baseline'\) is listed first, not the baseline 'baseline'"):
        decide("c", [stage, baseline], GatePolicy())


def test_items_a_parent_answered_for_its_child_do_not_re_judge_the_parent():
    """w8 went on 120 items; a8's length looks served it again for 120 more, which drift. w8's
    own verdict rests on its own 120 (QualityResult.own_sizes); a8 pairs with all 240."""
    from gates.checks import stage_checks
    from gates.policy import GatePolicy
    from tests.gates.records import record

    scores = [1.0, 0.0, 0.0] * 80
    lengths = [(20, 40, 60)[i % 3] for i in range(240)]
    baseline = record("baseline", None, scores, lengths)
    drifted = lengths[:120] + [int(n * (1.6 if i % 2 else 1.0)) for i, n in
                               enumerate(lengths[120:])]
    w8 = record("w8", "baseline", scores, drifted)
    policy = GatePolicy()

    def length(stage):
        return next(c for c in stage_checks(stage, baseline, baseline, policy)
                    if c.rule == "length")

    assert length(w8).status != "pass"  # judged on all 240 items
    w8.quality.own_sizes = {"math": 120}
    assert length(w8).status == "pass", length(w8).reason
