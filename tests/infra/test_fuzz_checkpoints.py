"""Property-based fuzzing of what a checkpoint folder holds (Hypothesis): quantization configs,
config.json's model keys, safetensors headers and shard indexes, tokenizer files. Each ends in a
valid checkpoint or in one clear line (a CheckpointError without a newline; exit 2 at `validate`),
never another exception, and within a bound; what the loaders refuse is never let through.
"""

from __future__ import annotations

import copy
import json
import math
import struct

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from flows.axes import derive_axes
from flows.cli import app
from infra.checkpoint import check_checkpoint, read_config
from infra.errors import CheckpointError, QuantgateError
from infra.quant_config import INT_BITS, quantization_problem
from infra.safetensors_check import check_safetensors
from tests.flows.checkpoints import W4A16, W8A8, make_checkpoint, safetensors_bytes
from tests.flows.test_bad_inputs import base_spec, tiny_tokenizer
from tests.flows.test_fuzz import FUZZ_EXAMPLES, damaged, one_error_line, values
from tests.flows.test_fuzz_hostile import BOUND_S, one_line_or_valid
from tests.gates.test_stored_tree import deadline
from tests.infra.test_cpu_support import AVX512

runner = CliRunner()
FAST = settings(max_examples=FUZZ_EXAMPLES, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
SLOW = settings(FAST, max_examples=FUZZ_EXAMPLES // 4)  # a child process or `validate` each

# What a hand-edited or half-written config holds where a number or a name belongs.
hostile = st.one_of(
    values,
    st.sampled_from([math.nan, math.inf, -math.inf, 0, -1, 1, 3, 16, 32, 2**31, 10**30, 4.0, True,
                     False, None, "4", "8", " 4", "int4", "INT", "Group", "", [], {}, [4], {"x": 1},
                     "pack_quantized", "-1", 1e-300]))
QC_FIELDS = ("num_bits", "type", "strategy", "group_size", "symmetric", "dynamic", "actorder",
             "block_structure", "observer", "observer_kwargs")
CONFIG_FIELDS = ("hidden_size", "num_hidden_layers", "vocab_size", "num_attention_heads",
                 "num_key_value_heads", "head_dim", "intermediate_size", "model_type",
                 "architectures", "tie_word_embeddings", "torch_dtype", "text_config",
                 "num_local_experts")


@st.composite
def quantization_configs(draw):
    """A real config (W4A16, W8A8, GPTQ) with some fields given hostile values, or damaged."""
    base = draw(st.sampled_from([W4A16, W8A8, {"quant_method": "gptq", "bits": 4,
                                               "group_size": 128, "desc_act": False}]))
    qc = copy.deepcopy(base)
    if qc["quant_method"] == "gptq":
        for key in draw(st.lists(st.sampled_from(["bits", "group_size", "desc_act", "sym"]),
                                 max_size=2)):
            qc[key] = draw(hostile)
        return qc
    group = qc["config_groups"]["group_0"]
    role = draw(st.sampled_from(["weights", "input_activations"]))
    args = group[role] or {}
    for key in draw(st.lists(st.sampled_from(QC_FIELDS), min_size=1, max_size=3)):
        args[key] = draw(hostile)
    group[role] = args
    if draw(st.booleans()):
        qc[draw(st.sampled_from(["format", "kv_cache_scheme", "ignore", "config_groups",
                                 "quantization_status"]))] = draw(hostile)
    return draw(st.one_of(st.just(qc), damaged(qc)))


@FAST
@given(qc=quantization_configs(), emulate=st.booleans())
def test_quantization_configs_are_one_line_or_give_axes(qc, emulate):
    config = {"model_type": "llama"} | ({"quantgate_emulated": {"quantization_config": qc}}
                                        if emulate else {"quantization_config": qc})
    problem = quantization_problem(config)
    if problem is None:  # what the check lets through, the axes can be derived from
        one_line_or_valid(derive_axes, config, {"kv_cache_dtype": "fp8"})
    else:
        assert "\n" not in problem and problem.startswith(("quantization_config",
                                                           "quantgate_emulated"))


@FAST
@given(bits=st.one_of(st.integers(-10, 64), st.floats(allow_nan=True), st.text(max_size=3),
                      st.booleans()),
       role=st.sampled_from(["weights", "input_activations"]))
def test_int_bits_outside_what_compressed_tensors_packs_are_always_refused(bits, role):
    qc = copy.deepcopy(W8A8)
    qc["config_groups"]["group_0"][role]["num_bits"] = bits
    problem = quantization_problem({"quantization_config": qc})
    valid = isinstance(bits, int) and not isinstance(bits, bool) and bits in INT_BITS
    assert (problem is None) == valid, (bits, problem)
    if not valid:
        assert f"config_groups.group_0.{role}.num_bits is" in problem


@FAST
@given(size=st.one_of(st.integers(-10**6, 10**6), st.sampled_from([0, -1, -2, "128", 64.0, None])))
def test_a_group_size_is_positive_or_minus_one(size):
    qc = copy.deepcopy(W4A16)
    qc["config_groups"]["group_0"]["weights"] |= {"group_size": size, "strategy": None}
    problem = quantization_problem({"quantization_config": qc})
    if size is None or size == -1 or (isinstance(size, int) and size > 0):
        assert problem is None or "group_size" not in problem.split(";")[0], problem
    else:
        assert problem is not None and ".weights.group_size is" in problem


@st.composite
def model_configs(draw):
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8,
              "vocab_size": 4, "num_hidden_layers": 1}
    for key in draw(st.lists(st.sampled_from(CONFIG_FIELDS), min_size=1, max_size=3)):
        config[key] = draw(hostile)
    return config


@FAST
@given(config=model_configs(), quant=st.sampled_from([None, W4A16]))
def test_model_keys_are_one_line_or_valid(tmp_path_factory, config, quant):
    folder = make_checkpoint(tmp_path_factory.mktemp("ckpt"))
    if quant:
        config["quantization_config"] = quant
    (folder / "config.json").write_text(json.dumps(config, allow_nan=True))
    (folder / "model.safetensors").write_bytes(safetensors_bytes({
        "model.embed_tokens.weight": ("BF16", [4, 8]), "model.layers.0.mlp.weight": ("BF16", [8])}))
    found = one_line_or_valid(read_config, folder)
    if not isinstance(found, QuantgateError):  # what read_config returns has sane sizes
        for key in ("hidden_size", "num_hidden_layers", "vocab_size"):
            value = found.get(key)
            assert value is None or (type(value) is int and value > 0) or isinstance(value, list)
    one_line_or_valid(check_checkpoint, folder)


names = st.one_of(st.sampled_from(["model.embed_tokens.weight", "model.norm.weight",
                                   "lm_head.weight", "model.layers.0.mlp.weight",
                                   "model.layers.1.mlp.weight", "model.layers.7.x.weight",
                                   "transformer.h.0.attn.weight", "a", "", "w\x00.weight"]),
                  st.text(max_size=12))
tensors = st.dictionaries(names, st.tuples(st.sampled_from(["BF16", "F32", "I8"]),
                                           st.lists(st.integers(0, 4), max_size=3)),
                          min_size=1, max_size=5)


@FAST
@given(found=tensors, layers=st.one_of(st.none(), st.integers(-1, 3), hostile),
       tied=st.one_of(st.none(), st.booleans()))
def test_weights_against_their_config_are_one_line_or_valid(tmp_path_factory, found, layers,
                                                            tied):
    folder = tmp_path_factory.mktemp("st")
    (folder / "model.safetensors").write_bytes(safetensors_bytes(found))
    config = {"model_type": "llama", "num_hidden_layers": layers, "tie_word_embeddings": tied}
    result = one_line_or_valid(check_safetensors, folder, config)
    data = sum(math.prod(shape) for _, shape in found.values())
    if data == 0:  # nothing to serve: never let through
        assert isinstance(result, CheckpointError), found
    if any(name.endswith(".weight") and 0 in shape for name, (_, shape) in found.items()):
        assert isinstance(result, CheckpointError), found


@FAST
@given(shard=st.one_of(st.text(max_size=20), st.sampled_from([
    "model.safetensors", "../model.safetensors", "/etc/passwd", "sub/model.safetensors",
    "model\x00.safetensors", "model.safetensors\n", ".safetensors", "model.bin", "C:\\m.safetensors"]),
    values), weight=st.text(max_size=10))
def test_index_entries_name_a_shard_in_the_folder_or_are_refused(tmp_path_factory, shard, weight):
    folder = tmp_path_factory.mktemp("index")
    (folder / "model.safetensors").write_bytes(safetensors_bytes())
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {weight or "w": shard}}, allow_nan=True))
    result = one_line_or_valid(check_safetensors, folder)
    if isinstance(shard, str) and (any(c in shard for c in "/\\") or
                                   any(ord(c) < 32 for c in shard)):
        assert isinstance(result, CheckpointError) and "not a plain file name" in str(result)
    assert "\x00" not in str(result)


@FAST
@given(length=st.one_of(st.none(), st.integers(0, 2**64 - 1)), header=values,
       data=st.integers(0, 64))
def test_raw_safetensors_bytes_are_one_line_or_valid(tmp_path_factory, length, header, data):
    folder = tmp_path_factory.mktemp("raw")
    text = json.dumps(header, allow_nan=True).encode()
    prefix = struct.pack("<Q", len(text) if length is None else length)
    (folder / "model.safetensors").write_bytes(prefix + text + b"\0" * data)
    one_line_or_valid(check_safetensors, folder, None)


def tiny_tokenizer_json() -> dict:
    """tests.flows.test_bad_inputs.tiny_tokenizer's file, as JSON."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tokenizer = Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    return json.loads(tokenizer.to_str())


@SLOW
@given(data=st.one_of(
    st.builds(lambda t: json.dumps(t, allow_nan=True), damaged(tiny_tokenizer_json())),
    st.binary(max_size=40).map(lambda b: b.decode("latin-1")),
    st.integers(1, 5000).map(lambda n: "[" * n + "]" * n),
    st.sampled_from(["", " ", "null", "{}", '{"model": null}', '{"version": "1.0"}'])))
def test_tokenizer_files_are_one_line_or_load(tmp_path_factory, data):
    folder = make_checkpoint(tmp_path_factory.mktemp("tok"))
    (folder / "tokenizer.json").write_text(data, encoding="utf-8", errors="surrogateescape")
    one_line_or_valid(check_checkpoint, folder)


@SLOW
@given(qc=quantization_configs(), config=model_configs())
def test_a_hostile_stage_checkpoint_is_one_line_at_validate(tmp_path_factory, monkeypatch, qc,
                                                            config):
    monkeypatch.setattr("flows.preflight.cpu_flags", lambda: AVX512)
    root = tmp_path_factory.mktemp("spec")
    spec = base_spec(root)
    checkpoint = make_checkpoint(root / "models" / "w4", W4A16)
    tiny_tokenizer(checkpoint / "tokenizer.json")
    (checkpoint / "config.json").write_text(json.dumps(config | {"quantization_config": qc},
                                                       allow_nan=True))
    spec["stages"] = [{"name": "w4", "kind": "weights", "checkpoint": str(checkpoint)}]
    path = root / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    with deadline(BOUND_S * 4):
        result = runner.invoke(app, ["validate", str(path)], env={"COLUMNS": "400"})
    if result.exit_code != 0:
        one_error_line(result)
