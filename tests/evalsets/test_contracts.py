"""Data contracts: the shipped sets pass; a broken row fails with its file, row, id and rule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evalsets import contracts
from evalsets.contracts import (
    Contract,
    fit_to_context,
    load_contract,
    requests_in_flight,
    validate_sets,
)
from evalsets.spec import EvalSetInfo, EvalSetSpec
from infra.errors import SpecError

pytest.importorskip("great_expectations")

LONG_CONTRACT = {
    "id": "id", "prompt": ["context", "question"], "reference": ["answer"], "group": "bucket",
    "lengths": {"field": "prompt_tokens", "bounds": {"512": [400, 480], "1k": [832, 992]}},
}


def _row(item_id: str, bucket: str = "512", tokens: int = 450, **changes) -> dict:
    row = {"id": item_id, "bucket": bucket, "prompt_tokens": tokens, "context": "Long text.",
           "question": "What is the pass key?", "answer": "12345"}
    return row | changes


def _set(tmp_path: Path, rows: list[dict], contract: dict | None = LONG_CONTRACT,
         task: str | None = None) -> EvalSetInfo:
    folder = tmp_path / "lc"
    folder.mkdir(exist_ok=True)
    (folder / "task.yaml").write_text(task or (
        "task: t\ndataset_kwargs:\n  data_files:\n    test: data.jsonl\n"
        "doc_to_text: \"{{context}}\\n\\n{{question}}\"\ndoc_to_target: \"{{answer}}\"\n"
        "generation_kwargs:\n  max_gen_toks: 16\nprocess_results: !function grading.x\n"))
    if contract is not None:
        (folder / "contract.yaml").write_text(json.dumps(contract))
    (folder / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return EvalSetInfo(name="lc", folder=folder)


def _validate(info: EvalSetInfo) -> None:
    contract = load_contract(info)
    for path in contracts.data_files(info):
        contracts.validate_frame(contracts._read_rows(path), contract, str(path))


def test_shipped_sets_pass():
    sets = [EvalSetSpec(name=name) for name in ("math", "business", "code", "long_context")]
    validate_sets(sets)
    rows = {spec.name: contracts.validate_set(spec) for spec in sets}
    assert rows["math"] >= 1000 and rows["business"] >= 300 and rows["code"] >= 150
    assert rows["long_context"] >= 4 * 30


def test_contract_read_off_task_yaml_when_no_contract_file(tmp_path):
    import shutil

    from evalsets.spec import EvalSetInfo

    math_info = EvalSetSpec(name="math").info
    shutil.copy(math_info.folder / "task.yaml", tmp_path / "task.yaml")
    contract = load_contract(EvalSetInfo(name="plain", folder=tmp_path))
    assert contract == Contract(id="id", prompt=["question"], reference=["answer"])


def test_generated_sets_declare_their_templates_as_clusters():
    for name in ("math", "business"):
        assert load_contract(EvalSetSpec(name=name).info).cluster == "template"


def test_good_rows_pass(tmp_path):
    _validate(_set(tmp_path, [_row("a"), _row("b", "1k", 900)]))


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        ([_row("a"), _row("a")], r"row 1 \(id 'a'.*broke rule 'id' is unique"),
        ([_row("a"), _row("b", question="   ")],
         r"row 2 \(id 'b'.*broke rule prompt field 'question' is present and not blank"),
        ([_row("a"), _row("b", context=None)],
         r"row 2 \(id 'b'.*broke rule prompt field 'context' is present and not blank"),
        ([_row("a", answer=""), _row("b")],
         r"row 1 \(id 'a'.*broke rule reference field 'answer' is present and not blank"),
        ([_row("a"), _row("b", "1k", 700)],
         r"row 2 \(id 'b'.*broke rule 'prompt_tokens' is at least its group's minimum"),
        ([_row("a", tokens=481)],
         r"row 1 \(id 'a'.*broke rule 'prompt_tokens' is at most its group's maximum"),
        ([_row("a"), _row("b", "8k", 9000)],
         r"row 2 \(id 'b'.*broke rule 'bucket' is a declared group \(1k, 512\)"),
        ([_row("a", tokens="many")], r"row 1 \(id 'a'.*broke rule 'prompt_tokens' is a number"),
    ],
)
def test_broken_row_names_file_row_id_and_rule(tmp_path, rows, expected):
    info = _set(tmp_path, rows)
    with pytest.raises(SpecError, match=expected) as caught:
        _validate(info)
    message = str(caught.value)
    assert message.startswith(str(info.folder / "data.jsonl"))
    assert "\n" not in message


def test_missing_field_everywhere_is_named(tmp_path):
    rows = [{k: v for k, v in _row("a").items() if k != "answer"}]
    with pytest.raises(SpecError, match="no field 'answer' in any row"):
        _validate(_set(tmp_path, rows))


def test_lengths_need_a_group(tmp_path):
    bad = {k: v for k, v in LONG_CONTRACT.items() if k != "group"}
    with pytest.raises(SpecError, match="'lengths' needs 'group'"):
        load_contract(_set(tmp_path, [_row("a")], contract=bad))


def test_unreadable_data_is_a_spec_error(tmp_path):
    info = _set(tmp_path, [_row("a")])
    (info.folder / "data.jsonl").write_text("{not json\n")
    with pytest.raises(SpecError, match="data.jsonl:1: not JSON"):
        _validate(info)


def test_fit_to_context_drops_buckets_that_cannot_fit():
    spec = EvalSetSpec(name="long_context", limit=8)
    assert fit_to_context([spec], 4096) == [spec]
    (short,) = fit_to_context([spec], 2048)
    assert short.groups == ["512", "1k"] and short.limit == 8
    (chosen,) = fit_to_context([spec.model_copy(update={"groups": ["4k", "512"]})], 2048)
    assert chosen.groups == ["512"]
    with pytest.raises(SpecError, match="no group fits max_model_len 256"):
        fit_to_context([spec], 256)
    math = EvalSetSpec(name="math")
    assert fit_to_context([math], 256) == [math]


def test_long_prompts_send_only_what_the_kv_cache_holds():
    long_context = EvalSetSpec(name="long_context", max_gen_toks=64)
    # Its longest bucket (4k: 3,968 prompt tokens) + 64 of template + 64 answer tokens per request.
    assert requests_in_flight(long_context, 64, 46_592) == 46_592 // 4_096 == 11
    short = long_context.model_copy(update={"groups": ["512"]})
    assert requests_in_flight(short, 64, 20_000) == 20_000 // 608 == 32
    assert requests_in_flight(short, 8, 46_592) == 8  # never more than asked
    assert requests_in_flight(long_context, 64, 1_000) == 1  # one at a time, never none
    assert requests_in_flight(long_context, 64, None) == 64  # the engine did not say
    assert requests_in_flight(EvalSetSpec(name="math"), 64, 1_000) == 64  # short prompts: all


def test_unknown_group_is_refused():
    with pytest.raises(SpecError, match="unknown group '4kk'.*did you mean '4k'"):
        validate_sets([EvalSetSpec(name="long_context", groups=["4kk"])])
    with pytest.raises(SpecError, match="declares no group field"):
        validate_sets([EvalSetSpec(name="math", groups=["a"])])


def test_a_repeated_key_in_task_yaml_is_refused(tmp_path):
    info = _set(tmp_path, [_row("a")], task="task: t\ndoc_to_text: a\ndoc_to_text: b\n"
                "process_results: !function grading.x\n")
    with pytest.raises(SpecError, match="duplicate key 'doc_to_text' at line 3"):
        contracts.read_task_yaml(info)


def test_ids_are_unique_as_the_pairing_compares_them(tmp_path):
    info = _set(tmp_path, [_row(7), _row("7")])
    with pytest.raises(SpecError, match=r"row 1 \(id '7'.*broke rule 'id' is unique"):
        _validate(info)


@pytest.mark.parametrize("changes, expected", [
    ({"scorer": "fuzzy"}, r"data.jsonl:1: scorer: .*scorers: exact, contains, json"),
    ({"scorer": "json", "reference": "{\"a\": 1}", "schema": "{\"type\": \"objekt\"}"},
     r"data.jsonl:1: .*invalid JSON Schema"),
])
def test_business_rows_their_scorer_cannot_use_fail_validation(tmp_path, monkeypatch, changes,
                                                               expected):
    import shutil

    shipped = EvalSetSpec(name="business").info.folder
    folder = tmp_path / "business"
    shutil.copytree(shipped, folder, ignore=shutil.ignore_patterns("__pycache__"))
    lines = (folder / "data.jsonl").read_text().splitlines()
    row = json.loads(lines[0]) | changes
    (folder / "data.jsonl").write_text("\n".join([json.dumps(row), *lines[1:]]) + "\n")
    monkeypatch.setattr(EvalSetSpec, "info", property(lambda self: EvalSetInfo("business", folder)))
    # A copy outside evalsets/ is a user's folder: its checker runs at `run`, not at `validate`.
    contracts.validate_set(EvalSetSpec(name="business"))
    with pytest.raises(SpecError, match=expected):
        contracts.validate_set(EvalSetSpec(name="business"), run_checks=True)
