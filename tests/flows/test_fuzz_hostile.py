"""Property-based fuzzing of the hostile input classes (Hypothesis), second round.

Checkpoint configs and quantization configs, safetensors headers, YAML alias bombs, JSON with
repeated keys, user regex patterns against long answers, policies and profiles with numbers no one
means, and stored runs whose stage tree is inconsistent. Each must end in a valid result or in one
clear line (a QuantgateError without a newline; exit 2 at the CLI), never another exception, and
within a bound (a hang fails the example instead of the suite).
"""

from __future__ import annotations

import copy
import json
import math
import shutil
import struct
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from flows.cli import app
from infra.errors import QuantgateError
from infra.yamlfile import MAX_ALIAS_EXPANSION
from tests.flows.checkpoints import W4A16, W8A8, safetensors_bytes
from tests.flows.test_fuzz import FUZZ_EXAMPLES, damaged, one_error_line, paths_of, values
from tests.gates.test_stored_tree import deadline, stored_run

runner = CliRunner()
# Each example of the function-level properties takes milliseconds; the CLI ones run `validate`.
FAST = settings(max_examples=FUZZ_EXAMPLES, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
CLI = settings(FAST, max_examples=FUZZ_EXAMPLES // 4)
BOUND_S = 30  # per example: generous; the claim is "ends", not "is fast"

extreme = st.sampled_from([math.inf, -math.inf, math.nan, 1e308, -1e308, 10**18, -(10**18),
                           2**63, -1, 0, 1e-320, 10**9, True, "1e9", "inf"])
CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "dtype": "bfloat16",
          "hidden_size": 8, "vocab_size": 4, "num_hidden_layers": 1}


def one_line_or_valid(call, *args):
    """Run `call`; a QuantgateError must be one line. Returns the result or the error."""
    with deadline(BOUND_S):
        try:
            return call(*args)
        except QuantgateError as err:
            assert "\n" not in str(err) and str(err).strip(), repr(err)
            return err


def hostile_json(tree) -> st.SearchStrategy[str]:
    """`tree` damaged, as JSON text; or that text with a key repeated, nested past any bound, or
    with NaN in it."""
    text = st.builds(lambda t: json.dumps(t, allow_nan=True), damaged(tree))
    repeated = st.builds(lambda t: json.dumps(t)[:-1] + ', "model_type": "gpt2"}', st.just(tree))
    deep = st.integers(60, 100_000).map(lambda n: "[" * n + "]" * n)
    return st.one_of(text, text, repeated, deep, st.just('{"hidden_size": NaN}'),
                     st.binary(max_size=30).map(lambda b: b.decode("latin-1")))


@FAST
@given(data=st.data(), quant=st.sampled_from([W4A16, W8A8, None]))
def test_checkpoint_and_quantization_configs_are_one_line_or_valid(tmp_path_factory, data, quant):
    from infra.checkpoint import check_checkpoint, read_config

    folder = tmp_path_factory.mktemp("ckpt")
    config = CONFIG | ({"quantization_config": copy.deepcopy(quant)} if quant else {})
    (folder / "config.json").write_text(data.draw(hostile_json(config)), encoding="utf-8",
                                        errors="surrogateescape")
    (folder / "model.safetensors").write_bytes(safetensors_bytes())
    (folder / "vocab.json").write_text("{}")
    one_line_or_valid(read_config, folder)
    one_line_or_valid(check_checkpoint, folder)


HEADER = {"__metadata__": {"format": "pt"},
          "model.embed_tokens.weight": {"dtype": "BF16", "shape": [4, 8], "data_offsets": [0, 64]}}


@FAST
@given(header=st.one_of(damaged(HEADER), values), length=st.one_of(st.none(), st.integers(0, 2**64 - 1)),
       data=st.integers(0, 128), config=st.one_of(st.none(), damaged(CONFIG)))
def test_safetensors_headers_are_one_line_or_valid(tmp_path_factory, header, length, data, config):
    from infra.safetensors_check import check_safetensors

    folder = tmp_path_factory.mktemp("st")
    text = json.dumps(header, allow_nan=True).encode()
    prefix = struct.pack("<Q", len(text) if length is None else length)
    (folder / "model.safetensors").write_bytes(prefix + text + b"\0" * data)
    one_line_or_valid(check_safetensors, folder, config if isinstance(config, dict) else None)


def alias_bomb(depth: int, width: int, self_alias: bool) -> str:
    lines = ["a0: &a0 [x, y]"]
    for level in range(1, depth + 1):
        refs = ", ".join([f"*a{level - 1}"] * width)
        lines.append(f"a{level}: &a{level} [{refs}]")
    if self_alias:
        lines.append("loop: &loop [*loop]")
    return "\n".join(lines) + "\n"


@FAST
@given(depth=st.integers(1, 12), width=st.integers(1, 12), self_alias=st.booleans())
def test_yaml_alias_bombs_are_refused_in_one_line_or_read(depth, width, self_alias):
    from infra.yamlfile import parse_yaml

    found = one_line_or_valid(parse_yaml, alias_bomb(depth, width, self_alias), "bomb.yaml")
    if self_alias or width ** depth > 2 * MAX_ALIAS_EXPANSION:
        assert isinstance(found, QuantgateError), "an endless or exploding document was read"


@CLI
@given(depth=st.integers(4, 12), width=st.integers(4, 12))
def test_an_alias_bomb_in_a_spec_is_one_line_at_validate(workspace, depth, width):
    root, spec = workspace
    path = root / "spec.yaml"
    path.write_text(yaml.safe_dump(spec) + alias_bomb(depth, width, False).replace("a0:", "x-0:"))
    with deadline(BOUND_S):
        result = runner.invoke(app, ["validate", str(path)], env={"COLUMNS": "300"})
    one_error_line(result)
    if width ** depth > 2 * MAX_ALIAS_EXPANSION:  # else the stray key is what is refused
        assert "billion laughs" in result.output, result.output


@FAST
@given(rows=st.lists(st.dictionaries(st.sampled_from(["id", "prompt", "reference", "x"]), values,
                                     min_size=1, max_size=4), min_size=1, max_size=3),
       repeat=st.sampled_from(["id", "prompt", "reference"]))
def test_json_rows_with_a_repeated_key_are_refused_by_line(tmp_path_factory, rows, repeat):
    from evalsets.userset import read_rows

    path = tmp_path_factory.mktemp("rows") / "data.jsonl"
    lines = [json.dumps(row, allow_nan=True) for row in rows]
    lines[-1] = lines[-1][:-1] + (", " if lines[-1] != "{}" else "") + f'"{repeat}": 1, "{repeat}": 2}}'
    path.write_text("\n".join(lines) + "\n")
    found = one_line_or_valid(read_rows, path)
    assert isinstance(found, QuantgateError), "a row with a repeated key was read"
    assert f"data.jsonl:{len(lines)}" in str(found)


regex_text = st.text(alphabet="a(+*?|)[]{},.^$\\d1-", max_size=14)


@FAST
@given(pattern=st.one_of(regex_text, st.sampled_from(["(a+)+$", "(a*)*b", "(a|aa)+$",
                                                      "((a+)+)+", "(?:a{1,30}){1,30}$", "[", "("])),
       answer=st.sampled_from(["a" * 5000 + "!", "a" * 30, "", "1,2,3"]))
def test_user_regexes_are_refused_or_bounded_on_long_answers(pattern, answer):
    from evalsets.patterns import regex_problem, score_regex

    problem = one_line_or_valid(regex_problem, pattern)
    if problem is None:  # accepted at validate: scoring must end, with an answer or one line
        one_line_or_valid(score_regex, answer, pattern)
    else:
        assert isinstance(problem, str) and "\n" not in problem


POLICY = yaml.safe_load((Path(__file__).parents[2] / "gates" / "policy.yaml").read_text())
PROFILE = yaml.safe_load((Path(__file__).parents[2] / "load" / "profiles" / "ci.yaml").read_text())


@st.composite
def extremes_in(draw, tree):
    """`tree` with one to three of its numbers replaced by values nobody means."""
    tree = copy.deepcopy(tree)
    numbers = [path for path, value in paths_of(tree)
               if path and isinstance(value, (int, float)) and not isinstance(value, bool)]
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(numbers))
        parent = tree
        for part in path[:-1]:
            parent = parent[part]
        parent[path[-1]] = draw(extreme)
    return tree


@CLI
@given(policy=extremes_in(POLICY), profile=extremes_in(PROFILE))
def test_policies_and_profiles_with_extreme_numbers_are_one_line_or_valid(workspace, policy,
                                                                          profile):
    root, spec = workspace
    (root / "policy.yaml").write_text(yaml.safe_dump(policy))
    (root / "profile.yaml").write_text(yaml.safe_dump(profile))
    path = root / "spec.yaml"
    path.write_text(yaml.safe_dump(spec | {"gate_policy": str(root / "policy.yaml"),
                                           "load_profile": str(root / "profile.yaml")}))
    with deadline(BOUND_S):
        result = runner.invoke(app, ["validate", str(path)], env={"COLUMNS": "300"})
    assert result.exit_code in (0, 2), result.output
    if result.exit_code == 2:
        one_error_line(result)


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    return stored_run(tmp_path_factory.mktemp("stored") / "run")  # baseline -> w -> a


@CLI
@given(data=st.data())
def test_stored_runs_with_inconsistent_trees_are_refused_or_judged(workspace, stored, data):
    """Parents redrawn among the stage names, a missing one and None (cycles, self-parents, two
    baselines, an orphan) and the manifest's order shuffled: `gate` refuses (2) or judges a tree
    that is still one run's (0/1), and ends."""
    root, _spec = workspace
    run = root / "run"
    shutil.rmtree(run, ignore_errors=True)
    shutil.copytree(stored, run)
    manifest = json.loads((run / "manifest.json").read_text())
    names = manifest["stages"]
    for name in names:
        record = json.loads((run / name / "stage.json").read_text())
        record["parent"] = data.draw(st.sampled_from([*names, None, "gone"]))
        (run / name / "stage.json").write_text(json.dumps(record))
    manifest["stages"] = data.draw(st.permutations(names))
    (run / "manifest.json").write_text(json.dumps(manifest))
    with deadline(BOUND_S):
        result = runner.invoke(app, ["gate", str(run)], env={"COLUMNS": "300"})
    assert result.exit_code in (0, 1, 2), result.output
    if result.exit_code == 2:
        one_error_line(result)
    else:
        from gates.decide import chain_problem, load_records

        _, records = load_records(run)
        assert chain_problem(records) is None
        assert records[0].parent is None
