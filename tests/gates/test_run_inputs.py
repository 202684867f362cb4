"""A run keeps what it asked (spec, sized load profile, prompts) in its folder: a re-gate reads it
there, and refuses a damaged or newer copy in one line."""

from __future__ import annotations

import json

import pytest

from flows.run_inputs import keep_inputs
from flows.spec import load_spec
from gates.run_inputs import RunInputs, stored_prompts
from infra.errors import QuantgateError
from load.profile import load_profile
from tests.flows.checkpoints import make_checkpoint

SPEC = """
candidate: c
baseline: {{checkpoint: {base}}}
engine: {{extra_args: ["--api-key", "planted-secret-key-0123456789"]}}
stages: [{{name: c1, kind: control}}]
evalsets: [{{name: math, limit: 20}}, {{name: long_context, limit: 20}}]
load_profile: ci
"""


def test_the_inputs_round_trip_and_hold_every_set_s_prompts(tmp_path):
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(SPEC.format(base=make_checkpoint(tmp_path / "bf16")))
    spec = load_spec(spec_path)
    profile = load_profile("ci").model_copy(update={"prompt_tokens": 77})
    keep_inputs(tmp_path / "run", spec, profile)
    spec_path.unlink()  # nothing below reads it again
    kept = RunInputs.kept(tmp_path / "run")
    assert kept.load_profile.prompt_tokens == 77 and kept.load_profile_name == "ci"
    assert [s["name"] for s in kept.spec["evalsets"]] == ["math", "long_context"]
    # The engine's key is masked, as in every other file of the run.
    assert "planted-secret-key" not in (tmp_path / "run" / "inputs" / "run.json").read_text()
    math = stored_prompts(tmp_path / "run", "math")
    assert len(math) > 1000 and all(text.strip() for text in math.values())
    assert stored_prompts(tmp_path / "run", "nonexistent") == {}
    assert RunInputs.kept(tmp_path / "elsewhere") is None  # a run from before inputs were kept


@pytest.mark.parametrize(("damage", "expected"), [
    (lambda data: data | {"schema_version": 9}, r"written by a newer quantgate \(schema 9"),
    (lambda data: {k: v for k, v in data.items() if k != "load_profile"}, "damaged"),
])
def test_a_damaged_or_newer_copy_is_refused_in_one_line(tmp_path, damage, expected):
    RunInputs(spec={}, load_profile=load_profile("ci"), load_profile_name="ci").keep(tmp_path, {})
    path = tmp_path / "inputs" / "run.json"
    path.write_text(json.dumps(damage(json.loads(path.read_text()))))
    with pytest.raises(QuantgateError, match=expected) as err:
        RunInputs.kept(tmp_path)
    assert str(path) in str(err.value) and "\n" not in str(err.value).split(" (")[0]


def test_the_what_if_workload_of_a_run_is_the_one_it_kept_even_with_its_spec_gone(tmp_path):
    from gates.record import RunManifest
    from gates.whatif.records import run_workload

    spec = tmp_path / "spec.yaml"
    spec.write_text("candidate: x\nload_profile: ci\n")
    RunManifest(candidate="x", stages=["baseline"], spec_path=str(spec)).save(tmp_path / "run")
    sized = load_profile("ci").model_copy(update={"prompt_tokens": 61})
    RunInputs(spec={}, load_profile=sized, load_profile_name="ci").keep(tmp_path / "run", {})
    spec.unlink()
    workload, origin = run_workload(tmp_path / "run")
    assert workload.prompt_tokens == 61 and origin == "load profile ci"
