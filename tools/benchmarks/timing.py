"""Where the time of acceptance runs went, and the pipeline's own overhead.

    python -m tools.benchmarks.timing RUN_DIR [RUN_DIR ...]

Per stage measured in the given runs (stages restored from the stage cache are listed but cost
no engine time): engine start-up, each eval set (items, generated tokens, seconds), corpus
scoring, adaptive looks, load (levels and capacity search) and the rest, the overhead. Then per
run: stages, gating, reporting and wall time. The figure issue 13 asks for is the last line:
pipeline overhead = wall − engine start-up − engine-busy time, as a share of the wall time.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from gates.record import RunManifest, StageRecord


def stage_rows(run: Path) -> list[dict]:
    manifest = RunManifest.read(run)
    rows = []
    for name in manifest.stages:
        reused = name in manifest.reused
        row = {"run": run.name, "stage": name, "reused": reused}
        if not (run / name / "stage.json").is_file():  # not finished (stopped, or not reached)
            rows.append(row | {"finished": False})
            continue
        timings = StageRecord.read(run / name).timings
        if timings is not None and not reused:
            row |= {"wall_s": timings.wall_s, "startup_s": timings.startup_s or 0.0,
                    "busy_s": round(timings.busy_s, 1), "overhead_s": round(timings.overhead_s, 1),
                    "scoring_s": timings.scoring_s, "more_items_s": timings.more_items_s,
                    "load_s": timings.load_s, "capacity_s": timings.capacity_s}
            for set_name, timing in timings.sets.items():
                row[f"{set_name}_s"] = timing.seconds
                row[f"{set_name}_items"] = timing.items
        rows.append(row)
    return rows


def run_rows(run: Path) -> dict:
    return {"run": run.name} | RunManifest.read(run).timings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    args = parser.parse_args(argv)
    stages = pd.DataFrame([row for run in args.runs for row in stage_rows(run)])
    runs = pd.DataFrame([run_rows(run) for run in args.runs])
    with pd.option_context("display.width", 250, "display.max_columns", 40):
        print(stages.to_string(index=False))
        print()
        print(runs.to_string(index=False))
    wall = runs["wall"].sum() if "wall" in runs else float("nan")
    measured = stages[~stages["reused"]] if "wall_s" in stages else stages.iloc[0:0]
    startup = measured["startup_s"].sum() if len(measured) else 0.0
    busy = measured["busy_s"].sum() if len(measured) else 0.0
    overhead = wall - startup - busy
    print(f"\nwall {wall:.0f} s = engine start-up {startup:.0f} s + engine busy {busy:.0f} s + "
          f"pipeline overhead {overhead:.0f} s ({overhead / wall:.1%} of the wall time)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
