"""Redaction masks values of credential settings and URI passwords, and nothing else: error
messages that name a path or an eval set called like a credential stay readable."""

from __future__ import annotations

import pytest

from infra import secrets
from infra.secrets import MASK, redact

KEY = "sk-planted-7f3a9c1e"


@pytest.fixture(autouse=True)
def forget(monkeypatch):
    monkeypatch.setattr(secrets, "_remembered", set())
    for name in ("OPENAI_API_KEY", "HF_TOKEN", "VLLM_API_KEY"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize("text", [
    "path '/etc/passwd': unsupported data file (valid: .jsonl, .csv)",
    "/etc/passwd: data file not found",
    "eval set 'token': a data file needs a scorer (kind: exact, choice, code)",
    "eval set 'token': missing",
    "eval set \"api_key\": a data file needs a scorer",
    "stage 'secret': parent 'baseline2' is not an earlier stage; valid: baseline",
    "passwd: data file not found",
    "evalsets.0.token: Field required (type=missing)",
    "folder my-token 2024_rows.jsonl is empty",
    "./runs/token: 12 rows, ./secret: 3 rows",
    "the tokenizer's max_tokens=32 budget; --tokenizer-mode slow",
    "send a Bearer token in the Authorization header",
])
def test_messages_that_only_name_a_credential_word_are_left_alone(text):
    assert redact(text) == text


@pytest.mark.parametrize(("text", "kept"), [
    (f"vllm serve m --api-key {KEY} --port 8000", "--port 8000"),
    (f"--api-key={KEY}", "--api-key="),
    (f"api_key: {KEY}", "api_key: "),
    (f"engine:\n  hf_token: {KEY}\n  port: 8000", "port: 8000"),
    (f'{{"api_key": "{KEY}", "port": 8000}}', '"port": 8000'),
    (f"{{'hf_token': '{KEY}'}}", "'hf_token': '"),
    (f"Authorization: Bearer {KEY}", "Authorization: Bearer "),
    (f"curl -H 'Authorization: Bearer {KEY}' http://h/v1/models", "http://h/v1/models"),
    (f"{{'Authorization': 'Bearer {KEY}'}}", "'Authorization': 'Bearer "),
    (f"authorization={KEY}", "authorization="),
    (f"https://alice:{KEY}@10.0.0.5:5000/api", "https://alice:"),
    (f"['--api-key', '{KEY}', '--quantization', 'fp8']", "'--quantization', 'fp8'"),
    (f"GET /v1/models?api_key={KEY}&limit=5", "&limit=5"),
    (f"hf_token: {KEY} is refused", "is refused"),
])
def test_every_form_a_credential_takes_is_masked(text, kept):
    out = redact(text)
    assert KEY not in out and MASK in out and kept in out


@pytest.mark.parametrize("text", [
    "password: hunter",
    "MLFLOW_TRACKING_PASSWORD=hunter",
    '{"password": "correct horse"}',
    "{'token': 'abc'}",
])
def test_a_credential_setting_is_masked_however_plain_its_value(text):
    out = redact(text)
    assert MASK in out and not any(word in out for word in ("hunter", "horse", "abc"))
