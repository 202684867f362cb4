"""The interrupted run's last line names what this run measured and stored, and where it is.

A results folder as a real run leaves it when Ctrl-C lands in its second stage: the stage cache
under it (its entries hold a stage.json too), this run's folder, and an older run of the same
spec. The line must name the baseline alone, and this run's folder.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from flows.interrupt import kept_line
from flows.settings import Settings


def _write(path: Path, data: dict, mtime: float | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    if mtime is not None:
        os.utime(path, (mtime, mtime))


def _stage(name: str, kind: str, key: str, error: str | None = None) -> dict:
    return {"name": name, "kind": kind, "cache_key": key, "error": error}


def _results(tmp_path: Path, spec: Path, started: float) -> tuple[Settings, Path]:
    settings = Settings(results_dir=tmp_path / "runs")
    cache = settings.stage_cache_dir
    older = tmp_path / "runs" / "e2e-older"
    _write(older / "manifest.json", {"stages": ["baseline", "old"], "spec_path": str(spec)},
           started - 3600)
    _write(older / "old" / "stage.json", _stage("old", "weights", "k-old"), started - 3600)
    ours = tmp_path / "runs" / "e2e-ours"
    for name, kind, error in [("baseline", "baseline", None), ("control", "control", None),
                              ("broken", "weights", "quality: lm-eval task 'math' failed")]:
        _write(ours / name / "stage.json", _stage(name, kind, f"k-{name}", error))
    for key in ("k-baseline", "k-old", "k-control"):  # control shares the baseline's serving
        _write(cache / key / "stage.json", _stage("baseline", "baseline", key))
    _write(ours / "manifest.json", {
        "stages": ["baseline", "control", "broken", "w8"], "spec_path": str(spec), "reused": {}})
    return settings, ours


def test_the_line_names_the_stages_this_run_stored_and_its_folder(tmp_path):
    spec = tmp_path / "spec.yaml"
    started = time.time() - 60
    settings, ours = _results(tmp_path, spec, started)

    line = kept_line(spec, settings, started)

    assert line == (
        f"`quantgate run {spec}` stopped and its engines with it; measured stage(s) baseline kept "
        f"in the stage cache {settings.stage_cache_dir}; partial results under {ours}; run the "
        "same command again to resume (stored stages are reused, not measured again)")


def test_a_stage_taken_from_the_cache_is_not_called_measured(tmp_path):
    spec = tmp_path / "spec.yaml"
    started = time.time() - 60
    settings, ours = _results(tmp_path, spec, started)
    manifest = json.loads((ours / "manifest.json").read_text())
    _write(ours / "manifest.json", manifest | {"reused": {"baseline": "k-baseline"}})

    assert "; no stage had finished; " in kept_line(spec, settings, started)


def test_with_no_cache_the_resume_is_the_command_without_it(tmp_path):
    spec = tmp_path / "spec.yaml"
    started = time.time() - 60
    settings, _ = _results(tmp_path, spec, started)

    line = kept_line(spec, settings, started, no_cache=True)

    assert line.endswith(f"; run `quantgate run {spec}` (without --no-cache) to resume (stored "
                         "stages are reused, not measured again)")
