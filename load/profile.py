"""Load profiles: the YAML that says how hard and how long a stage is loaded."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from infra.errors import SpecError, did_you_mean
from infra.values import MAX_COUNT, MAX_SECONDS, Count, Seconds, day_at_most, soak_at_most
from infra.yamlfile import load_model
from load.gpu_slos import gpu_slo

PROFILES_DIR = Path(__file__).parent / "profiles"


class Slo(BaseModel):
    """A service-level objective per request: a request meets it when every set bound holds."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    ttft_ms: float | None = Field(default=None, gt=0, description="Highest acceptable TTFT.")
    tpot_ms: float | None = Field(default=None, gt=0, description="Highest acceptable TPOT.")

    @model_validator(mode="after")
    def _some_bound(self) -> Slo:
        if self.ttft_ms is None and self.tpot_ms is None:
            raise ValueError("an SLO needs ttft_ms, tpot_ms or both")
        return self


class CapacitySearch(BaseModel):
    """Bounded search for the highest Poisson request rate at which `target` of requests meet the SLO."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    enabled: bool = Field(default=False, description="Off by default: a search costs several runs.")
    every_stage: bool = Field(
        default=False, description="Search every stage; by default only the baseline and the "
        "final candidate (the last stage), the two a capacity figure is read for.")
    min_rate: float = Field(default=0.25, gt=0, description="Lowest rate tried (requests/s).")
    max_rate: float = Field(default=8.0, gt=0, description="Highest rate tried (requests/s).")
    iterations: int = Field(
        default=4, ge=0, le=12, description="Bisection steps after both bounds were tried."
    )
    duration_s: Seconds = Field(default=20.0, gt=0, description="Measured seconds per tried rate.")
    warmup_s: Seconds = Field(default=3.0, ge=0, description="Unmeasured seconds before each rate.")
    target: float = Field(
        default=0.99, gt=0, le=1, description="Share of requests that must meet the SLO."
    )
    min_requests: Count = Field(
        default=20, ge=1,
        description="Expected arrivals per tried rate: a low rate runs longer, for "
        "max(duration_s, min_requests / rate) measured seconds, so that it is judged on data.",
    )
    pool_users: Count = Field(
        default=64,
        ge=1,
        description="Users that fire the scheduled arrivals; more than rate x latency, or "
        "arrivals start late (recorded as dispatch lag).",
    )

    def window_s(self, rate: float) -> float:
        """Measured seconds at `rate`: long enough to expect min_requests arrivals."""
        return max(self.duration_s, self.min_requests / rate)

    @model_validator(mode="after")
    def _bounds_ordered(self) -> CapacitySearch:
        if self.max_rate <= self.min_rate:
            raise ValueError(f"max_rate ({self.max_rate}) must be > min_rate ({self.min_rate})")
        if self.max_rate * self.window_s(self.max_rate) > MAX_COUNT:
            raise ValueError(f"max_rate {self.max_rate:g} req/s would send "
                             f"{self.max_rate * self.window_s(self.max_rate):,.0f} requests in "
                             f"one tried rate, over {MAX_COUNT:,}; lower max_rate or duration_s")
        if self.window_s(self.min_rate) > MAX_SECONDS:
            raise ValueError(f"min_rate {self.min_rate:g} req/s would measure min_requests "
                             f"({self.min_requests}) for {self.window_s(self.min_rate):,.0f} s, over "
                             f"a day ({MAX_SECONDS:,} s); raise min_rate or lower min_requests")
        return self


class PromptSource(BaseModel):
    """Where the load's prompts come from: random token ids (default), or prompts replayed from an
    eval set or a user file with their real length distribution (load/prompts.py)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: Literal["random", "evalset", "file"] = Field(
        default="random", description="random: prompt_tokens random token ids per request; "
        "evalset: the prompts of a built-in eval set (`name`); file: a user file (`path`).")
    name: str | None = Field(default=None, description="evalset: the built-in set, e.g. 'math'.")
    path: str | None = Field(
        default=None, description="file: JSONL with a prompt field, or plain text, one prompt a "
        "line; relative to the profile file.")
    field: str = Field(default="prompt", description="file, JSONL: the field holding the prompt.")

    @model_validator(mode="after")
    def _named(self) -> PromptSource:
        wanted = {"random": (), "evalset": ("name",), "file": ("path",)}[self.source]
        for key in ("name", "path"):
            if key in wanted and getattr(self, key) is None:
                raise ValueError(f"source {self.source} needs {key}")
            if key not in wanted and getattr(self, key) is not None:
                raise ValueError(f"{key} is for source {'evalset' if key == 'name' else 'file'}, "
                                 f"not {self.source}")
        if self.source == "evalset":
            from evalsets.spec import registry

            sets = registry()
            if self.name not in sets:
                raise ValueError(f"unknown eval set {self.name!r}: {did_you_mean(self.name, tuple(sets))}")
        return self


class LoadProfile(BaseModel):
    """Two concurrency levels of fixed-size streaming requests; every stage does equal work."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    low_users: Count = Field(default=1, ge=1, description="Concurrent users at the low level.")
    high_users: Count = Field(ge=1, description="Concurrent users at the high level.")
    prompt_tokens: Count = Field(
        ge=1, description="Random prompts: exact prompt length in tokens (sent as token ids, so "
        "it never drifts). Prompts from a source: the longest one sent (longer ones are left out)."
    )
    prompts: PromptSource = Field(
        default_factory=PromptSource, description="Random token ids, or prompts replayed from "
        "an eval set or a file.")
    output_tokens: Count = Field(
        ge=2,
        description="Exact output length: requests use ignore_eos and max_tokens = this value.",
    )
    warmup_s: Seconds = Field(
        default=5.0,
        ge=0,
        description="Duration runs: requests started during the warm-up are left out of stats.",
    )
    # Before duration_s: its check reads it (pydantic validates fields in this order).
    soak: bool = Field(
        default=False, exclude_if=lambda soak: not soak,  # a profile without it dumps (and keys
        # the stage cache) as before it existed
        description="A soak run: duration_s may be longer than a day (a longer window is "
        "otherwise a typo, refused).")
    duration_s: float | None = Field(
        default=None, gt=0, description="Measured seconds per level, after the warm-up (at most "
        "a day; with `soak: true`, up to 30 days)."
    )
    requests: Count | None = Field(
        default=None,
        ge=1,
        description="Instead of duration_s: measured requests per level (single process only).",
    )
    warmup_requests: Count = Field(
        default=0, ge=0, description="Request-count runs: first requests left out of stats."
    )
    repeats: int = Field(
        default=1, ge=1, le=20, description="Runs per level; 2 or more give confidence intervals."
    )
    rounds: int = Field(
        default=3,
        ge=3,
        le=20,
        description="A timed stage and its reference run in this many interleaved rounds per "
        "level (reference then stage, then stage then reference, ...); the latency gate's "
        "t-interval over per-round ratios needs at least 3.",
    )
    round_requests: Count = Field(
        default=6, ge=2, description="Measured requests per side, level and round (a count)."
    )
    round_warmup_requests: Count = Field(
        default=1, ge=0, description="Unmeasured first requests of each side's run in a round."
    )
    max_error_rate: float = Field(
        default=0.01, ge=0, le=1, description="Highest acceptable share of failed requests."
    )
    request_timeout_s: Seconds = Field(
        default=120.0, gt=0, description="Client timeout for one request, connect to last byte."
    )
    seed: int = Field(default=1234, description="Seed of the prompt token-id generator.")
    slo: Slo | None = Field(default=None, description="Per-request SLO for goodput; none: no goodput.")
    gpu_slo: str | None = Field(default=None, description="The SLO predictions on target GPUs "
                                "are judged by (`quantgate whatif`): a preset of load/gpu_slos.py, "
                                "e.g. mlperf-llama3.1-8b-server; none: the reference one.")
    capacity: CapacitySearch = Field(
        default_factory=CapacitySearch, description="Capacity search under the SLO (Poisson)."
    )
    workers: int = Field(
        default=0,
        ge=0,
        le=64,
        description="0: one Locust process; N: Locust distributed mode, a master and N workers.",
    )
    # Prompts from a source, tokenized for the served model (load.prompts.bind): a run-time
    # binding, not part of the YAML or of the cache key (the source's content digest is).
    _prompt_ids: Path | None = PrivateAttr(default=None)

    @field_validator("duration_s")
    @classmethod
    def _a_day_unless_soak(cls, value: float | None, info: ValidationInfo) -> float | None:
        if info.data.get("soak"):
            soak_at_most(value)
        else:
            day_at_most(value, "set soak: true to ask for up to 30 days")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> LoadProfile:
        if self.high_users < self.low_users:
            raise ValueError(f"high_users ({self.high_users}) must be >= low_users ({self.low_users})")
        if (self.duration_s is None) == (self.requests is None):
            raise ValueError("set exactly one of duration_s (seconds) or requests (a count)")
        if self.requests is not None and self.workers:
            raise ValueError(
                f"requests (a count) runs in one process; distributed mode (workers: "
                f"{self.workers}) needs duration_s"
            )
        if self.gpu_slo is not None:
            gpu_slo(self.gpu_slo)
        if self.capacity.enabled and self.slo is None:
            raise ValueError("capacity.enabled needs an slo (ttft_ms and/or tpot_ms)")
        return self

    @property
    def prompt_ids(self) -> Path | None:
        """The token-id file the locustfile replays (load.prompts.bind), or None."""
        return self._prompt_ids

    def with_prompt_ids(self, path: Path) -> LoadProfile:
        bound = self.model_copy()
        bound._prompt_ids = path
        return bound

    def levels(self) -> dict[str, int]:
        """Level name -> concurrent users, in the order they run."""
        return {"low": self.low_users, "high": self.high_users}

    def check_fits(self, max_model_len: int | None, source: str) -> None:
        """Refuse a profile whose requests cannot fit the engine's context (known only once the
        spec's engine and this profile meet): every request would be refused by the server."""
        needed = self.prompt_tokens + self.output_tokens
        if max_model_len is not None and needed > max_model_len:
            raise SpecError(
                f"load profile {source}: prompt_tokens ({self.prompt_tokens}) + output_tokens "
                f"({self.output_tokens}) = {needed} tokens per request, but engine.max_model_len "
                f"is {max_model_len}; shorten the profile's requests or raise engine.max_model_len")


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
    """Read and validate a load profile; a name ("ci") picks a bundled one. A prompt file's
    relative path is made absolute against the profile's folder."""
    found = profile_path(path)
    profile = load_model(found, LoadProfile)
    prompts = profile.prompts
    if prompts.path is not None and not Path(prompts.path).is_absolute():
        absolute = str((found.resolve().parent / prompts.path).resolve())
        profile = profile.model_copy(update={"prompts": prompts.model_copy(update={"path": absolute})})
    return profile
