"""The capacity what-if checked against a run measured on this CPU: prediction vs measurement.

    python -m tools.benchmarks.whatif_cpu RUN_DIR [--profile NAME] [--quick]

The roofline's two efficiency knobs are fitted to the baseline stage's low-load TTFT and TPOT
(this machine's CPU described with nominal peaks: the knobs absorb their error); every stage is
then predicted and put beside what the run measured, with the relative error (predicted /
measured - 1). Emulated stages served their dequantized bf16 twin: not comparable. Capacity is
compared where the run searched it (load profile `capacity.enabled`). The same table is in the
sign-off report's what-if section.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from gates.decide import load_records
from gates.whatif import workload_from_profile
from gates.whatif.records import run_workload
from gates.whatif.section import (
    CPU_SETTINGS,
    REPORT_SETTINGS,
    describe_workload,
    whatif_section,
)
from load.profile import load_profile, profile_path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path, help="a results folder (with manifest.json)")
    parser.add_argument("--profile", help="load profile; default: the one the run's spec named")
    parser.add_argument("--quick", action="store_true",
                        help="the report's short GPU simulation for the capacity (default: the "
                        "what-if's defaults, as the report's CPU check uses)")
    args = parser.parse_args()

    _, records = load_records(args.run_dir)
    if args.profile:
        workload = workload_from_profile(load_profile(args.profile))
        origin = f"load profile {profile_path(args.profile)}"
    else:
        workload, origin = run_workload(args.run_dir)
    started = time.perf_counter()
    section = whatif_section(records, workload, origin, gpus=(),
                             cpu_settings=REPORT_SETTINGS if args.quick else CPU_SETTINGS)
    print(f"Prediction vs measurement on this CPU — {args.run_dir}")
    print(f"Workload: {describe_workload(workload)} ({origin})")
    print(f"Device: {section.cpu_device}; {section.cpu_source}")
    if not section.cpu_rows:
        print(f"No comparison: {section.cpu_note}")
        return
    print(f"Knobs: {section.cpu_knobs}")
    print(f"Simulation: {section.cpu_settings}\n")
    print("| stage | TTFT ms predicted | measured | error | TPOT ms predicted | measured | error "
          "| capacity req/s predicted | measured | error | note |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in section.cpu_rows:
        print(f"| {r['stage']} | {r['ttft']} | {r['ttft_measured']} | {r['ttft_error']} "
              f"| {r['tpot']} | {r['tpot_measured']} | {r['tpot_error']} "
              f"| {r['capacity']} | {r['capacity_measured']} | {r['capacity_error']} "
              f"| {r['note']} |")
    for line in section.skipped:
        print(f"no prediction for {line}")
    print(f"\n({time.perf_counter() - started:.1f} s)")


if __name__ == "__main__":
    main()
