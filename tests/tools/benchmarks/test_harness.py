"""The benchmark replays exactly what lm-eval sent, and reports rates in one unit."""

from __future__ import annotations

import json

import pytest

from tools.benchmarks.harness import Throughput, decode_payloads, logged_payloads


@pytest.mark.parametrize("shape", ["lm-eval file", "runner file"])
def test_replay_payloads_rebuilt_from_lm_eval_sample_log(tmp_path, shape):
    messages = [{"role": "user", "content": "Question: 2+3?\nAnswer:"}]
    gen_kwargs = {"until": ["Question:"], "do_sample": False, "temperature": 0.0,
                  "max_gen_toks": 96}
    arguments = ({"gen_args_0": {"arg_0": json.dumps(messages), "arg_1": gen_kwargs}}
                 if shape == "lm-eval file" else [[[json.dumps(messages)], gen_kwargs]])
    sample = {"doc_id": 0, "arguments": arguments}
    log = tmp_path / "samples.jsonl"
    log.write_text(json.dumps(sample) + "\n")
    (payload,) = logged_payloads(log, "m", "http://127.0.0.1:9/v1/chat/completions")
    assert payload["messages"] == messages
    assert payload["model"] == "m"
    assert payload["max_tokens"] == 96 and payload["temperature"] == 0
    assert payload["stop"] == ["Question:"]


def test_rates_and_decode_payloads():
    row = Throughput(label="x", items=10, seconds=4.0, output_tokens=200)
    assert (row.items_per_s, row.tokens_per_s) == (2.5, 50.0)
    payloads = decode_payloads("m", 3, 128)
    assert len(payloads) == 3 and all(p["ignore_eos"] and p["max_tokens"] == 128 for p in payloads)
