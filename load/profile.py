"""Load profiles: the YAML that says how hard and how long a stage is loaded."""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from infra.errors import SpecError, did_you_mean

PROFILES_DIR = Path(__file__).parent / "profiles"


class LoadProfile(BaseModel):
    """Two concurrency levels of fixed-size streaming requests; every stage does equal work."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    low_users: int = Field(default=1, ge=1, description="Concurrent users at the low level.")
    high_users: int = Field(ge=1, description="Concurrent users at the high level.")
    prompt_tokens: int = Field(
        ge=1, description="Exact prompt length in tokens (sent as token ids, so it never drifts)."
    )
    output_tokens: int = Field(
        ge=2,
        description="Exact output length: requests use ignore_eos and max_tokens = this value.",
    )
    warmup_s: float = Field(
        default=5.0, ge=0, description="Requests started during the warm-up are left out of stats."
    )
    duration_s: float = Field(gt=0, description="Measured seconds per level, after the warm-up.")
    max_error_rate: float = Field(
        default=0.01, ge=0, le=1, description="Highest acceptable share of failed requests."
    )
    request_timeout_s: float = Field(
        default=120.0, gt=0, description="Client timeout for one request, connect to last byte."
    )
    seed: int = Field(default=1234, description="Seed of the prompt token-id generator.")

    @model_validator(mode="after")
    def _levels_ordered(self) -> LoadProfile:
        if self.high_users < self.low_users:
            raise ValueError(f"high_users ({self.high_users}) must be >= low_users ({self.low_users})")
        return self

    def levels(self) -> dict[str, int]:
        """Level name -> concurrent users, in the order they run."""
        return {"low": self.low_users, "high": self.high_users}


def bundled_profiles() -> list[str]:
    """Names of the profiles shipped in load/profiles/."""
    return sorted(p.stem for p in PROFILES_DIR.glob("*.yaml"))


def profile_path(name_or_path: str | Path) -> Path:
    """A bundled profile name ("demo") or a path to a YAML file -> the file's path."""
    candidate = Path(name_or_path)
    if candidate.suffix in (".yaml", ".yml") or candidate.parent != Path("."):
        if not candidate.is_file():
            raise SpecError(f"load profile file not found: {candidate}")
        return candidate
    bundled = PROFILES_DIR / f"{name_or_path}.yaml"
    if not bundled.is_file():
        raise SpecError(
            f"unknown load profile {str(name_or_path)!r}; "
            f"{did_you_mean(str(name_or_path), bundled_profiles())}"
        )
    return bundled


def load_profile(path: str | Path) -> LoadProfile:
    """Read and validate a load profile; a name ("ci") picks a bundled one."""
    path = profile_path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise SpecError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise SpecError(f"{path}: expected a mapping of fields, got {type(data).__name__}")
    try:
        return LoadProfile.model_validate(data)
    except ValidationError as exc:
        raise SpecError(f"{path}: {_describe(exc)}") from exc


def _describe(exc: ValidationError) -> str:
    """Pydantic's errors as "field 'x': problem" lines, with a hint for misspelt fields."""
    valid = tuple(LoadProfile.model_fields)
    lines = []
    for err in exc.errors():
        field = ".".join(str(part) for part in err["loc"]) or "(profile)"
        if err["type"] == "extra_forbidden":
            lines.append(f"unknown field {field!r}; {did_you_mean(field, valid)}")
        elif err["type"] == "missing":
            lines.append(f"field {field!r}: required")
        else:
            message = err["msg"].removeprefix("Value error, ")
            lines.append(f"field {field!r}: {message} (got {err.get('input')!r})")
    return "; ".join(lines)
