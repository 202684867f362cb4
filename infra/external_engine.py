"""A server that is already running somewhere: quantgate probes it but never starts or stops it."""

from __future__ import annotations

from pathlib import Path

import httpx

from infra.checkpoint import weight_bytes
from infra.engine import Engine, EngineFacts, register
from infra.errors import EngineError
from infra.probe import cache_config, get_json, optional_int


@register
class ExternalEngine(Engine):
    kind = "external"

    def __init__(self, spec, checkpoint: Path, flags, log_path: Path, stage: str = "") -> None:
        self.spec = spec
        self.checkpoint = checkpoint
        self.base_url = spec.stage_urls.get(stage, spec.url).rstrip("/")

    def start(self) -> EngineFacts:
        try:
            models = get_json(self.base_url, "/v1/models")["data"]
        except (httpx.HTTPError, KeyError, ValueError) as err:
            raise EngineError(f"external engine at {self.base_url} is not answering: {err}") from err
        names = [m["id"] for m in models]
        model = self.spec.model or (names[0] if len(names) == 1 else None)
        if model not in names:
            raise EngineError(
                f"external engine at {self.base_url} serves {names}; set engine.model to one of them"
            )
        try:
            cache = cache_config(httpx.get(f"{self.base_url}/metrics", timeout=10).text)
        except httpx.HTTPError:
            cache = {}
        return EngineFacts(
            base_url=self.base_url,
            model=model,
            command=[f"(external server at {self.base_url})"],
            kv_cache_tokens=optional_int(cache.get("kv_cache_size_tokens")),
            kv_cache_dtype=cache.get("cache_dtype"),
            kv_cache_bytes=optional_int(cache.get("kv_cache_memory_bytes")),
            weight_bytes=weight_bytes(self.checkpoint) if self.checkpoint.is_dir() else None,
            max_model_len=next(m for m in models if m["id"] == model).get("max_model_len"),
        )

    def stop(self) -> None:
        """Not ours to stop."""
