"""The environment that keeps what quantgate runs quiet and offline: no telemetry, no downloads.

One value per variable. DO_NOT_TRACK is "1": vLLM honours only "1", Prefect "1"/"true"/"yes";
MLflow reads only "true" there, so it is told by MLFLOW_DISABLE_TELEMETRY instead.
"""

from __future__ import annotations

QUIET_ENV = {
    "DO_NOT_TRACK": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "90",
    "TQDM_DISABLE": "1",  # lm-eval's and vLLM's bars: quantgate shows its own progress
}


def quiet(*names: str) -> dict[str, str]:
    """The QUIET_ENV entries `names`, for a process that must get those and no others."""
    return {name: QUIET_ENV[name] for name in names}
