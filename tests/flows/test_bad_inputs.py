"""The bad-input table: each input `validate` must refuse, in one line naming the field, exit 2."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from flows.cli import app
from tests.flows.checkpoints import W4A16, make_checkpoint
from tests.infra.test_cpu_support import AVX512

runner = CliRunner()
SECRET = "pw-planted-5b1e77"


def tiny_tokenizer(path: Path) -> None:
    """A word-level tokenizer.json: one token per whitespace-separated word."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tokenizer = Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(path))


def base_spec(tmp_path: Path) -> dict:
    bf16 = make_checkpoint(tmp_path / "models" / "bf16")
    tiny_tokenizer(bf16 / "tokenizer.json")
    return {
        "candidate": "demo",
        "baseline": {"checkpoint": str(bf16)},
        "stages": [{"name": "kv", "kind": "kv_cache", "engine_flags": {"kv_cache_dtype": "fp8"}}],
        "evalsets": [{"name": "math", "limit": 60}],
        "load_profile": "ci",
    }


def busy_port() -> socket.socket:
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    return held


def external(spec: dict, **engine) -> None:
    spec["engine"] = {"kind": "external", "url": "http://127.0.0.1:9", **engine}
    spec["stages"][0]["kind"] = "control"
    del spec["stages"][0]["engine_flags"]


def w4_stage(spec: dict, tmp_path: Path) -> None:
    w4 = make_checkpoint(tmp_path / "models" / "w4", W4A16)
    tiny_tokenizer(w4 / "tokenizer.json")  # the baseline's, as a quantized copy ships it
    spec["stages"] = [{"name": "w4", "kind": "weights", "checkpoint": str(w4)}]


def only_8bit_policy(spec: dict, tmp_path: Path) -> None:
    policy = yaml.safe_load((Path(__file__).parents[2] / "gates" / "policy.yaml").read_text())
    del policy["tolerances"]["4bit"]
    (tmp_path / "policy.yaml").write_text(yaml.safe_dump(policy))
    w4_stage(spec, tmp_path)
    spec["gate_policy"] = str(tmp_path / "policy.yaml")


def no_tokenizer(spec: dict, tmp_path: Path) -> None:
    bare = make_checkpoint(tmp_path / "models" / "bare", W4A16)
    (bare / "vocab.json").unlink()
    spec["stages"] = [{"name": "w", "kind": "weights", "checkpoint": str(bare)}]


def list_config(spec: dict, tmp_path: Path) -> None:
    odd = make_checkpoint(tmp_path / "models" / "odd")
    (odd / "config.json").write_text(json.dumps([1, 2]))
    spec["stages"] = [{"name": "w", "kind": "weights", "checkpoint": str(odd)}]


# (case, change to the spec, what the one line must say)
CASES = [
    ("axis flag in extra_args",
     lambda s, t: s.update(engine={"extra_args": ["--quantization", "fp8"]}),
     "'--quantization' (--quantization) is not accepted in extra_args: use "
     "engine_flags.quantization"),
    ("flag overriding a typed field",
     lambda s, t: s["stages"][0]["engine_flags"].update(extra_args=["--kv-cache-dtype", "auto"]),
     "use engine_flags.kv_cache_dtype"),
    ("--api-key on one stage",
     lambda s, t: s["stages"][0]["engine_flags"].update(extra_args=["--api-key", SECRET]),
     "'--api-key' belongs in engine.extra_args"),
    ("password in an external URL",
     lambda s, t: external(s, url=f"http://bob:{SECRET}@10.0.0.5:8000"),
     "carries a password; give the server's API key through engine.api_key_env"),
    ("misspelt stage_urls key",
     lambda s, t: external(s, stage_urls={"kvv": "http://127.0.0.1:10"}),
     "engine.stage_urls: 'kvv' is not a stage; did you mean 'kv'"),
    ("unset api_key_env",
     lambda s, t: external(s, api_key_env="QG_TEST_UNSET_KEY"),
     "engine.api_key_env: environment variable QG_TEST_UNSET_KEY is not set"),
    ("eval set listed twice",
     lambda s, t: s["evalsets"].append({"name": "math"}),
     "'math' listed twice"),
    ("unknown eval set",
     lambda s, t: s["evalsets"].append({"name": "maths"}),
     "unknown eval set 'maths'"),
    ("dtype float128",
     lambda s, t: s.update(engine={"dtype": "float128"}),
     "engine.vllm.dtype"),
    ("max_model_len below the prompts",
     lambda s, t: s.update(engine={"max_model_len": 150}),
     "leaves no room for a prompt in engine.max_model_len 150 (64 tokens go to the template); "
     "give max_gen_toks at most 85, or raise engine.max_model_len above 160 with room for the "
     "prompts"),
    ("checkpoint without tokenizer", no_tokenizer, "has no tokenizer"),
    ("config.json that is a list", list_config, "is not a model config: a JSON list"),
    ("policy without the stage's precision", only_8bit_policy,
     "gate policy has no tolerances for '4bit' stages"),
    ("limit below min_items",
     lambda s, t: s["evalsets"][0].update(limit=5),
     "eval sets too small for the accuracy gate"),
]


@pytest.mark.parametrize("change, expected", [case[1:] for case in CASES],
                         ids=[case[0] for case in CASES])
def test_validate_refuses_in_one_line(tmp_path, monkeypatch, change, expected):
    monkeypatch.setattr("flows.preflight.cpu_flags", lambda: AVX512)
    monkeypatch.delenv("QG_TEST_UNSET_KEY", raising=False)
    spec = base_spec(tmp_path)
    change(spec, tmp_path)
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    result = runner.invoke(app, ["validate", str(path)], env={"COLUMNS": "300"})
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2, result.output
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert expected in lines[0] and SECRET not in result.output


def test_a_port_in_use_is_refused_by_validate(tmp_path, monkeypatch):
    monkeypatch.setattr("flows.preflight.cpu_flags", lambda: AVX512)
    spec = base_spec(tmp_path)
    with busy_port() as held:
        port = held.getsockname()[1]
        spec["engine"] = {"port": port}
        path = tmp_path / "spec.yaml"
        path.write_text(yaml.safe_dump(spec))
        result = runner.invoke(app, ["validate", str(path)], env={"COLUMNS": "300"})
    assert result.exit_code == 2
    assert f"engine.port {port} on 127.0.0.1 is already in use" in result.output


def test_the_good_spec_of_the_table_validates(tmp_path, monkeypatch):
    monkeypatch.setattr("flows.preflight.cpu_flags", lambda: AVX512)
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(base_spec(tmp_path)))
    result = runner.invoke(app, ["validate", str(path)], env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("uri, expected", [
    (f"postgresql+nodriver://bob:{SECRET}@127.0.0.1:1/mlflow",
     "its database driver cannot be loaded"),
    (f"http://bob:{SECRET}@127.0.0.1:1", "the MLflow server does not answer"),
])
def test_a_tracking_store_that_cannot_open_is_one_line_without_its_password(tmp_path, monkeypatch,
                                                                          uri, expected):
    monkeypatch.setattr("flows.preflight.cpu_flags", lambda: AVX512)
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(base_spec(tmp_path)))
    for command in ("validate", "run"):
        result = runner.invoke(app, [command, str(path)],
                               env={"COLUMNS": "300", "MLFLOW_TRACKING_URI": uri})
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert result.exit_code == 2 and len(lines) == 1, result.output
        assert expected in lines[0] and "bob:<redacted>@" in lines[0]
        assert SECRET not in result.output
