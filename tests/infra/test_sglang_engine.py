"""SGLang as an engine kind, against tests/infra/fake_sglang.py (SGLang's response shapes, cited
there from its sources): the launch command and its placement, start-up through a stand-in
`sglang.launch_server` module, the facts from /get_server_info and the start-up log, the
served-configuration check, prompt logprobs for the divergence corpus and guided decoding.
A real SGLang run needs a CUDA host (PyPI's sglang is a CUDA build)."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

import pytest
from pydantic import ValidationError

from evalsets.perplexity import measure_perplexity
from evalsets.structured import check_guided_decoding
from evalsets.token_corpus import ScoredSequence, ScoringCorpus, Span
from flows.cache import engine_part
from flows.engines import placed, plan_run_placement
from flows.plan import plan
from flows.served import ServedMismatchError, check_served
from flows.spec import EngineFlags, Spec, load_spec
from infra.errors import MeasurementError, SpecError
from infra.placement import Gpu, declared_gpus
from infra.sglang_engine import SglangEngine, fraction_of_free, log_memory
from tests.flows.checkpoints import W8A8, make_checkpoint
from tests.infra.fake_sglang import FakeSglang

REPO = Path(__file__).resolve().parents[2]
GIB = 2**30
# A start-up log's memory lines as SGLang prints them (python/sglang/srt/model_executor/
# model_runner.py "Load weight end", mem_cache/memory_pool.py "KV Cache is allocated"), in the
# form a Qwen3-14B TP=4 run printed them (one line per rank; two ranks here).
LOG = textwrap.dedent("""\
    [2026-11-30 10:00:01 TP0] Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem=16.00 GB, mem usage=7.08 GB.
    [2026-11-30 10:00:01 TP1] Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem=16.00 GB, mem usage=7.08 GB.
    [2026-11-30 10:00:02 TP0] KV Cache is allocated. #tokens: 298447, K size: 5.69 GB, V size: 5.69 GB
    """)  # noqa: E501


def chain(tmp_path: Path, **engine) -> Spec:
    base = make_checkpoint(tmp_path / "bf16")
    config = json.loads((base / "config.json").read_text()) | {
        "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
        "head_dim": 64, "hidden_size": 576}
    (base / "config.json").write_text(json.dumps(config))
    return Spec.model_validate({
        "candidate": "c", "baseline": {"checkpoint": str(base)},
        "engine": {"kind": "sglang", **engine},
        "stages": [{"name": "kv", "kind": "kv_cache", "engine_flags": {"kv_cache_dtype": "fp8"}}],
        "evalsets": [{"name": "math", "limit": 40}],
    })


def test_the_launch_command_is_sglangs_and_carries_the_placement(tmp_path):
    spec = chain(tmp_path, port=30000)
    stages = plan(spec)
    placement = plan_run_placement(spec, stages, 5120, declared_gpus(80, 1))
    assert placement.shared  # one GPU: the stage and its reference split it
    command, env = placed(spec.engine, placement, beside=True, stage="baseline").command(
        Path("/m"), stages[1].engine_flags)
    assert command[:12] == ["python", "-m", "sglang.launch_server", "--model-path", "/m",
                            "--host", "127.0.0.1", "--port", "30000", "--dtype", "bfloat16",
                            "--context-length"]
    assert command[command.index("--kv-cache-dtype") + 1] == "fp8_e4m3"  # SGLang's spelling
    assert command[command.index("--mem-fraction-static") + 1] == "0.47"
    assert env["CUDA_VISIBLE_DEVICES"] == "0"
    # Eight GPUs and two per engine: --tp, and the engine beside on its own pair.
    spec = chain(tmp_path / "tp", tensor_parallel_size=2)
    placement = plan_run_placement(spec, plan(spec), 5120, declared_gpus(80, 8))
    command, env = placed(spec.engine, placement, beside=True, stage="baseline").command(
        Path("/m"), EngineFlags())
    assert command[command.index("--tp") + 1] == "2" and env["CUDA_VISIBLE_DEVICES"] == "2,3"


def test_the_cache_key_names_sglang_and_leaves_out_the_port_and_the_key(tmp_path):
    spec = chain(tmp_path, port=30000, extra_args=["--api-key", "sk-secret-1234567890"])
    stages = plan(spec)
    part = engine_part(spec, stages[1])
    assert part["kind"] == "sglang" and part["version"].startswith(("sglang ", "unknown"))
    assert "30000" not in part["command"] and "sk-secret-1234567890" not in json.dumps(part)
    assert engine_part(spec, stages[0]) != part  # the KV flag is in the key


def test_flags_sglang_sets_itself_are_refused_with_the_field_to_use(tmp_path):
    with pytest.raises(ValidationError, match=r"--tp.*engine.tensor_parallel_size"):
        chain(tmp_path, extra_args=["--tp", "2"])
    spec = chain(tmp_path / "ok").model_dump(mode="json")
    spec["stages"][0]["engine_flags"]["extra_args"] = ["--mem-fraction-static=0.5"]
    with pytest.raises(ValidationError, match=r"mem-fraction-static.*engine.gpu_memory_utilization"):
        Spec.model_validate(spec)
    with pytest.raises(ValidationError, match="gpu_count needs gpu_memory_gib"):
        chain(tmp_path / "count", gpu_count=2)


def test_a_second_engine_asks_sglang_for_its_share_of_the_free_memory():
    """SGLang's fraction is of the memory free at its start, not of the device."""
    empty = [Gpu(index=0, memory_bytes=80 * GIB)]
    half_used = [Gpu(index=0, memory_bytes=80 * GIB, used_bytes=40 * GIB)]
    assert fraction_of_free(0.47, [0], empty) == 0.47
    assert fraction_of_free(0.47, [0], half_used) == 0.94  # 0.47 of 80 GiB = 0.94 of 40 free
    assert fraction_of_free(0.6, [0], half_used) == 0.95  # capped: SGLang needs some headroom
    assert fraction_of_free(0.47, [1], half_used) == 0.47  # not this engine's GPU


def test_memory_is_read_from_the_start_up_log():
    weights, kv = log_memory(LOG)
    assert weights == int(2 * 7.08 * GIB)  # summed over ranks
    assert kv == int((5.69 + 5.69) * GIB)
    assert log_memory("KV Cache is allocated. #tokens: 524288, KV size: 17.16 GB")[1] == int(
        17.16 * GIB)
    assert log_memory("nothing") == (None, None)


def launcher(tmp_path: Path) -> Path:
    """A stand-in `sglang.launch_server`: parses SGLang's flags, prints the start-up log's
    memory lines and serves FakeSglang on --port with what it was told in /get_server_info."""
    package = tmp_path / "stub" / "sglang"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "launch_server.py").write_text(textwrap.dedent(f"""\
        import argparse, sys, time
        from tests.infra.fake_sglang import FakeSglang
        parser = argparse.ArgumentParser()
        for flag in ("--model-path", "--host", "--dtype", "--quantization", "--kv-cache-dtype",
                     "--tp", "--mem-fraction-static", "--api-key"):
            parser.add_argument(flag)
        parser.add_argument("--port", type=int)
        parser.add_argument("--context-length", type=int)
        args = parser.parse_args()
        print({LOG!r}, flush=True)
        FakeSglang(args.model_path, port=args.port, info={{
            "dtype": args.dtype, "quantization": args.quantization, "context_length":
            args.context_length, "kv_cache_dtype": args.kv_cache_dtype or "auto",
            "mem_fraction_static": float(args.mem_fraction_static)}}).start()
        time.sleep(600)
        """))
    return tmp_path / "stub"


def test_an_engine_started_through_the_launcher_reports_its_facts_and_serves_its_axes(
        tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(launcher(tmp_path)), str(REPO)]))
    spec = chain(tmp_path, startup_timeout_s=60)
    kv_stage = plan(spec)[1]
    engine = SglangEngine(spec.engine, kv_stage.checkpoint, kv_stage.engine_flags,
                          tmp_path / "kv" / "engine.log", kv_stage.name)
    with engine as facts:
        assert facts.command[:3] == [sys.executable, "-m", "sglang.launch_server"]
        assert facts.kv_cache_tokens == 658_432
        assert facts.kv_cache_tokens_from == "/get_server_info max_total_num_tokens"
        assert facts.kv_cache_dtype == "fp8_e4m3" and facts.version == "0.5.23"
        assert facts.weight_memory_bytes == int(2 * 7.08 * GIB)
        assert facts.max_model_len == 4096 and facts.attention_backend == "fa3"
        check_served(kv_stage, facts, spec.engine, tmp_path / "kv" / "engine.log")
        # The same engine is not what the baseline declares (its KV cache is fp8).
        with pytest.raises(ServedMismatchError, match="serves kv_cache fp8_e4m3 but its axes say auto"):
            check_served(plan(spec)[0], facts, spec.engine, tmp_path / "kv" / "engine.log")
    assert not engine.alive()


def test_the_served_check_reads_the_quantization_sglang_runs(tmp_path):
    spec = chain(tmp_path)
    baseline = plan(spec)[0]
    log = tmp_path / "engine.log"
    log.write_text(LOG)
    model = str(baseline.checkpoint)
    with FakeSglang(model, info={"quantization": "fp8"}) as fake:
        engine = SglangEngine(spec.engine, baseline.checkpoint, baseline.engine_flags, log)
        engine.base_url = fake.base_url
        facts = engine._facts(["python"], {})
        with pytest.raises(ServedMismatchError, match=r"serves weights float8/tensor \(quantization "
                                                      r"fp8\) but its axes say none"):
            check_served(baseline, facts, spec.engine, log)
    # A checkpoint SGLang quantizes from its own config: /get_server_info says quantization
    # None, and the served check reads the method from the checkpoint it loaded.
    w8a8 = make_checkpoint(tmp_path / "w8a8", W8A8)
    spec = Spec.model_validate(spec.model_dump(mode="json") | {"stages": [
        {"name": "w8", "kind": "weights_activations", "checkpoint": str(w8a8)}]})
    stage = plan(spec)[1]
    with FakeSglang(str(w8a8)) as fake:
        engine = SglangEngine(spec.engine, w8a8, stage.engine_flags, log)
        engine.base_url = fake.base_url
        facts = engine._facts(["python"], {})
        assert facts.quantization == "compressed-tensors"
        check_served(stage, facts, spec.engine, log)


def test_prompt_logprobs_from_sglangs_echo_score_the_divergence_corpus(tmp_path):
    corpus = ScoringCorpus(source="baseline", chat_template=True, sequences=[
        ScoredSequence(name="a", token_ids=[5, 6, 7, 8, 9], spans=[Span(name="a", start=1, end=5)])])
    out = tmp_path / "ppl"
    out.mkdir()
    (out / "scoring_corpus.json").write_text(corpus.model_dump_json())
    with FakeSglang("/m") as fake:
        result = measure_perplexity(fake.base_url, "/m", out)
        body = fake.requests[-1]
    assert body["echo"] is True and body["prompt"] == [5, 6, 7, 8, 9]
    assert result.tokens == 4  # the first prompt token (null) and the generated one left out
    assert result.sum_logprob == pytest.approx(sum(-0.1 - (t % 7) / 10 for t in (6, 7, 8, 9)))


def test_guided_decoding_is_asked_as_sglang_reads_it(tmp_path):
    with FakeSglang("/m") as fake:
        check_guided_decoding(fake.base_url, "/m", chat=True)
        check_guided_decoding(fake.base_url, "/m", chat=False)
        assert fake.requests[-1]["response_format"]["json_schema"]["schema"]["required"] == ["ok"]
    with FakeSglang("/m", guided=False) as fake, pytest.raises(
            MeasurementError, match="guided decoding is not applied"):
        check_guided_decoding(fake.base_url, "/m", chat=True)


def test_a_misspelt_kind_is_answered_with_the_registered_kinds(tmp_path):
    spec = chain(tmp_path).model_dump(mode="json")
    spec["engine"] = {"kind": "sglan"}
    path = tmp_path / "spec.yaml"
    path.write_text(json.dumps(spec))
    with pytest.raises(SpecError, match=r"'sglan' is not one of its choices; did you mean "
                       r"'sglang'\? \(valid: external, sglang, vllm\)"):
        load_spec(path)
