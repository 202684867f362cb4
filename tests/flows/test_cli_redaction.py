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
