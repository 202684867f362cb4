"""Small HTTP probes of an OpenAI-compatible server: health, models, metrics."""

from __future__ import annotations

import re

import httpx

from infra.secrets import auth_headers

CACHE_INFO = re.compile(r"^vllm:cache_config_info\{(?P<labels>[^}]*)\}", re.MULTILINE)
LABEL = re.compile(r'(\w+)="([^"]*)"')


def healthy(base_url: str, timeout_s: float = 2.0) -> bool:
    try:
        return httpx.get(f"{base_url}/health", timeout=timeout_s).status_code == 200
    except httpx.HTTPError:
        return False


def get_json(base_url: str, path: str, timeout_s: float = 10.0) -> dict:
    response = httpx.get(f"{base_url}{path}", timeout=timeout_s, headers=auth_headers())
    response.raise_for_status()
    return response.json()


def cache_config(metrics_text: str) -> dict[str, str]:
    """Labels of vllm:cache_config_info (kv_cache_size_tokens, cache_dtype, ...), or {}."""
    match = CACHE_INFO.search(metrics_text)
    return dict(LABEL.findall(match.group("labels"))) if match else {}


def optional_int(value: str | None) -> int | None:
    try:
        return int(float(value)) if value not in (None, "", "None") else None
    except ValueError:
        return None


def skip_layers(value: str | None) -> list[int] | None:
    """vLLM's kv_cache_dtype_skip_layers label ("['0', '3']", Python's str of a list) as layer
    indices; None where the label is missing or names something else ('sliding_window')."""
    if value is None:
        return None
    names = re.findall(r"'([^']*)'", value)
    return [int(name) for name in names] if all(name.isdigit() for name in names) else None


def model_entry(base_url: str, model: str, timeout_s: float = 10.0) -> dict:
    """The /v1/models entry of `model` (vLLM's has `root`: the path it loaded), or {}."""
    models = get_json(base_url, "/v1/models", timeout_s).get("data") or []
    return next((entry for entry in models if entry.get("id") == model), {})
