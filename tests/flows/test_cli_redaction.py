"""A refused spec's message reads as written where it only names a credential word."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from flows.cli import app
from tests.flows.test_spec import write_spec


@pytest.mark.parametrize(("evalset", "expected"), [
    ({"name": "token", "path": "rows.jsonl"},
     "eval set 'token': a data file needs a scorer (kind: exact"),
    ({"name": "x", "path": "/etc/passwd"}, "path '/etc/passwd': unsupported data file (valid: "),
])
def test_validate_shows_the_message_unmasked(tmp_path, evalset, expected):
    (tmp_path / "rows.jsonl").write_text('{"id": 1, "prompt": "p", "answer": "a"}\n')
    path = write_spec(tmp_path, evalsets=[evalset])
    result = CliRunner().invoke(app, ["validate", str(path)], env={"COLUMNS": "400"})
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert expected in lines[0] and "<redacted>" not in result.output


@pytest.mark.parametrize("extra_args", [
    ["--api-key", "hunter", "--quantization", "fp8"],
    ["--hf-token", "abc", "--chat-template", "x"],
    ["--api-key=hunter", "--quantization", "fp8"],
])
def test_a_refused_list_never_shows_the_key_it_holds_however_plain(tmp_path, extra_args):
    path = write_spec(tmp_path, engine={"extra_args": extra_args})
    result = CliRunner().invoke(app, ["validate", str(path)], env={"COLUMNS": "400"})
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert "is not accepted in extra_args" in lines[0] and "<redacted>" in lines[0], lines[0]
    assert "hunter" not in result.output and "'abc'" not in result.output
