from pathlib import Path

import pytest

from infra import secrets
from infra.secrets import MASK, auth_headers, engine_key, redact, redact_args, split_api_key
from infra.vllm_engine import build_command

KEY = "sk-planted-7f3a9c1e"


@pytest.fixture(autouse=True)
def forget(monkeypatch):
    monkeypatch.setattr(secrets, "_remembered", set())
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)


@pytest.mark.parametrize("text", [
    f"postgresql://quant:{KEY}@db:5432/mlflow",
    f"error: cannot reach http://alice:{KEY}@10.0.0.5:5000/api",
    f"--api-key={KEY}",
    f'{{"api_key": "{KEY}"}}',
    f"hf_token: {KEY}",
    f"MLFLOW_TRACKING_PASSWORD={KEY}",
    f"engine.extra_args ['--api-key', '{KEY}', '--quantization', 'fp8'] is refused",
    f'["--hf-token", "{KEY}"]',
    f"vllm serve m --api-key {KEY} --port 8000",
])
def test_credentials_in_text_are_masked(text):
    out = redact(text)
    assert KEY not in out and MASK in out


def test_ordinary_text_is_left_alone():
    text = "max_tokens: 32, output_tokens=17, tokenizer: /models/x http://127.0.0.1:8000/v1"
    assert redact(text) == text
    prose = "give the key through --api-key instead; --tokenizer-mode slow; --api-key --port 8"
    assert redact(prose) == prose


def test_remembered_and_environment_values_are_masked_anywhere(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_abcdefghijkl")
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    secrets.remember(KEY)
    out = redact(f"log line with {KEY} and hf_abcdefghijkl, parallelism false")
    assert KEY not in out and "hf_abcdefghijkl" not in out and "false" in out


def test_command_lines_mask_flag_values_in_both_spellings():
    args = ["--api-key", KEY, "--hf-token=hf_x1y2z3w4", "--max-num-seqs", "31"]
    assert redact_args(args) == ["--api-key", MASK, f"--hf-token={MASK}", "--max-num-seqs", "31"]


def test_the_api_key_leaves_the_command_line_for_the_engine_environment():
    from flows.spec import EngineFlags, VllmEngineSpec

    spec = VllmEngineSpec(port=8123, extra_args=["--api-key", KEY, "--max-num-seqs", "8"])
    flags = EngineFlags()
    shown, shown_env = build_command(spec, Path("/m"), flags)
    served, served_env = build_command(spec, Path("/m"), flags, reveal=True)
    assert KEY not in " ".join(shown) + str(shown_env) and shown_env["VLLM_API_KEY"] == MASK
    assert KEY not in " ".join(served) and served_env["VLLM_API_KEY"] == KEY
    assert "--api-key" not in served and served[-2:] == ["--max-num-seqs", "8"]


def test_split_api_key_takes_it_out():
    assert split_api_key(["--api-key=abc123", "--x", "1"]) == (["--x", "1"], "abc123")
    assert split_api_key(["--x", "1"]) == (["--x", "1"], None)


def test_clients_send_the_key_only_inside_the_context():
    assert auth_headers() == {}
    with engine_key(KEY):
        assert auth_headers() == {"Authorization": f"Bearer {KEY}"}
        assert KEY not in redact(f"x {KEY}")
    assert auth_headers() == {}
