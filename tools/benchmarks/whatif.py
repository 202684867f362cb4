"""The capacity what-if beside the published H100 table (Qwen2.5-7B, 1,024 in / 256 out).

    python -m tools.benchmarks.whatif [--seeds 5] [--gpus h100-sxm,h200,b200,a100-80g,l40s]

Published yardstick (a continuous-batching simulator of one H100 SXM; SLO TTFT <= 1 s and TPOT
<= 40 ms for 99 % of requests): max request rates and low-load TTFT / TPOT per format. Prints the
reproduced figures at seed 0 (what the test asserts), the spread of the capacity over `--seeds`
arrival seeds, and the same stages on other GPUs. Every figure it prints is a prediction.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from gates.whatif import SimSettings, Workload, markdown, whatif_table

CONFIG = Path(__file__).resolve().parents[2] / "tests" / "gates" / "qwen25_7b_config.json"
STAGES = {
    "BF16": {"weights": "none", "activations": "none", "kv_cache": "auto"},
    "W4A16": {"weights": "int4/group128", "activations": "none", "kv_cache": "auto"},
    "W8A8 FP8": {
        "weights": "float8/channel", "activations": "float8/token/dynamic", "kv_cache": "auto",
    },
    "W8A8 FP8 + KV FP8": {
        "weights": "float8/channel", "activations": "float8/token/dynamic", "kv_cache": "fp8_e4m3",
    },
}
# stage: (max req/s, low-load TTFT ms, low-load TPOT ms), as published.
PUBLISHED = {
    "BF16": (22.5, 33.8, 5.2),
    "W4A16": (24.6, 32.0, 1.9),
    "W8A8 FP8": (46.5, 16.2, 2.8),
    "W8A8 FP8 + KV FP8": (49.3, 16.2, 2.8),
}
WORKLOAD = Workload(prompt_tokens=1024, output_tokens=256)


def _error(value: float, reference: float) -> str:
    return f"{value:.1f} ({value / reference - 1:+.0%})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=CONFIG, help="config.json of the model")
    parser.add_argument("--seeds", type=int, default=5, help="arrival seeds for the spread")
    parser.add_argument("--gpus", default="h100-sxm,h200,b200,a100-80g,l40s")
    args = parser.parse_args()
    config = json.loads(args.config.read_text())

    started = time.perf_counter()
    runs = [
        whatif_table(config, STAGES, ["h100-sxm"], WORKLOAD, settings=SimSettings(seed=seed))
        .set_index("stage")
        for seed in range(args.seeds)
    ]
    table = runs[0]
    print("H100 SXM, Qwen2.5-7B, 1,024 / 256 tokens — prediction vs published (error)\n")
    print("| stage | max req/s published | predicted (seed 0) | over seeds "
          "| TTFT ms published | predicted | TPOT ms published | predicted |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for stage, (rate, ttft, tpot) in PUBLISHED.items():
        row = table.loc[stage]
        spread = [run.loc[stage, "capacity_rps"] for run in runs]
        print(
            f"| {stage} | {rate} | {_error(row.capacity_rps, rate)} "
            f"| {min(spread):.1f}–{max(spread):.1f} | {ttft} | {_error(row.ttft_ms, ttft)} "
            f"| {tpot} | {row.tpot_ms:.2f} ({row.tpot_ms / tpot - 1:+.0%}) |"
        )
    print(f"\nSource: {table['source'].iloc[0]}. "
          f"({args.seeds} seeds in {time.perf_counter() - started:.1f} s)\n")

    gpus = [gpu for gpu in args.gpus.split(",") if gpu]
    print(markdown(whatif_table(config, STAGES, gpus, WORKLOAD), WORKLOAD))


if __name__ == "__main__":
    main()
