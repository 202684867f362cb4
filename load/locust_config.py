"""What the locustfile is told: the one place its QG_* variables and their defaults live.

Each field travels as QG_<FIELD IN CAPITALS> (model: QG_MODEL, timeout_s: QG_TIMEOUT_S, ...):
load/launch.py writes a LocustConfig into each Locust process's environment (to_env) and the
locustfile reads it back at import (from_env). Standard library only: the locustfile imports
this module in Locust's own process.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields


def env_name(name: str) -> str:
    """The variable a field travels in."""
    return f"QG_{name.upper()}"


@dataclass(frozen=True)
class LocustConfig:
    model: str = ""  # the served model name; required
    prompt_tokens: int = 128
    output_tokens: int = 32
    seed: int = 1234
    level: str = ""
    # A stage timed against an engine the run kept up gets prompt streams of its own: the kept
    # engine has already answered the unsalted ones, and a repeat would hit its prefix cache.
    prompt_salt: str = ""
    timeout_s: float = 120.0
    max_requests: int = 0  # a request budget for the process (0: none)
    rate: float = 0.0  # open loop: Poisson arrivals per second (0: closed loop)
    # Open loop: no arrival is sent later than this many seconds after the first (0: no limit). A
    # user that would wait past it stops, rather than sleeping through Locust's stop timeout.
    arrivals_for_s: float = 0.0
    total_users: int = 0
    # Distributed mode: the master ends the run itself after this many seconds (0: Locust's -t).
    master_run_s: float = 0.0
    # Token ids far from the special tokens at the start of the vocabulary and inside any
    # vocabulary the demo models use (SmolLM2 has 49,152), so every id is an ordinary token.
    token_id_min: int = 1000
    token_id_max: int = 40000
    samples_file: str = ""  # where the samples go, as JSON lines (empty: nowhere)
    # Fields every request adds, e.g. a structured_output stage's response_format (guided decoding).
    request_body: dict = field(default_factory=dict)
    # Prompts replayed from a source (load/prompts.py): token ids, one JSON list a line; empty: random.
    prompts_file: str = ""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> LocustConfig:
        """The variables that are set; the defaults for the others."""
        values = {}
        for f in fields(cls):
            raw = environ.get(env_name(f.name))
            if f.name == "request_body":
                values[f.name] = json.loads(raw or "{}")
            elif raw is not None:
                values[f.name] = type(f.default)(raw)
        return cls(**values)

    def to_env(self) -> dict[str, str]:
        """Every field as its variable."""
        env = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, dict):
                env[env_name(f.name)] = json.dumps(value)
            elif isinstance(f.default, float):
                env[env_name(f.name)] = repr(float(value))
            else:
                env[env_name(f.name)] = str(value)
        return env
