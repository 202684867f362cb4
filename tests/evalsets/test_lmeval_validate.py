"""`quantgate validate` on a spec naming an lm-eval task: where its data are, or one line and exit 2."""

from __future__ import annotations

import yaml
from typer.testing import CliRunner

from flows.cli import app
from tests.evalsets.lmeval_data import gsm8k
from tests.evalsets.test_lmeval_task import empty_hf_cache  # noqa: F401 (a fixture)
from tests.flows.test_cli import cpu, emulated_chain  # noqa: F401 (a fixture)
from tests.flows.test_spec import write_spec
from tests.infra.test_cpu_support import AVX512

runner = CliRunner()


def with_sets(tmp_path, sets: list[dict]):
    """The demo chain CPUs serve (emulated W8A16) with these eval sets."""
    emulated_chain(tmp_path)
    path = tmp_path / "spec.yaml"
    spec = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump(spec | {"evalsets": sets}))
    return path


def test_validate_names_each_task_s_offline_data(tmp_path, cpu):  # noqa: F811
    cpu(AVX512)
    folder = gsm8k(tmp_path / "gsm8k-local", n=240)
    path = with_sets(tmp_path, [{"name": "math", "limit": 60},
                                {"lm_eval": "gsm8k", "num_fewshot": 2, "limit": 60, "data": "gsm8k-local"}])
    result = runner.invoke(app, ["validate", str(path)], env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    assert (f"eval set gsm8k: lm-eval task gsm8k (generate_until, filter strict-match), 240 items, "
            f"data offline from {folder.resolve()}") in result.output


def test_validate_without_the_data_is_one_line_and_exit_2(tmp_path, cpu, empty_hf_cache):  # noqa: F811
    cpu(AVX512)
    path = with_sets(tmp_path, [{"name": "math", "limit": 60}, {"lm_eval": "gsm8k"}])
    result = runner.invoke(app, ["validate", str(path)], env={"COLUMNS": "300"})
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(
        "error: eval set 'gsm8k': lm-eval task 'gsm8k': its data (openai/gsm8k/main) is not "
        "available offline; put it in the Hugging Face cache"), result.output


def test_a_chat_spec_refuses_a_log_likelihood_task(tmp_path):
    path = write_spec(tmp_path, evalsets=[{"name": "math", "limit": 60}, {"lm_eval": "arc_easy"}])
    result = runner.invoke(app, ["validate", str(path)], env={"COLUMNS": "300"})
    assert result.exit_code == 2
    assert "'arc_easy' (lm-eval arc_easy) is a multiple_choice task" in result.output


def test_one_task_listed_twice_would_count_its_items_twice(tmp_path):
    path = write_spec(tmp_path, evalsets=[{"lm_eval": "gsm8k"},
                                          {"name": "gsm8k-8shot", "lm_eval": "gsm8k", "num_fewshot": 8}])
    result = runner.invoke(app, ["validate", str(path)])
    assert result.exit_code == 2
    assert ("evalsets: 'gsm8k' and 'gsm8k-8shot' are the same data (lm-eval task gsm8k); its items "
            "would count twice in the pooled test") in " ".join(result.output.split())
