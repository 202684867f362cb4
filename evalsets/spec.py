"""Which eval sets a candidate is measured on, and the registry of the built-in ones.

A built-in set is a folder `evalsets/<name>/` holding an lm-eval `task.yaml` and its local data;
adding a business, code or long-context set means adding such a folder, nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, Field, field_validator

from infra.errors import SpecError, did_you_mean

EVALSETS_DIR = Path(__file__).resolve().parent
TASK_FILE = "task.yaml"


@dataclass(frozen=True)
class EvalSetInfo:
    """A built-in eval set on disk."""

    name: str
    folder: Path

    @property
    def task_yaml(self) -> Path:
        return self.folder / TASK_FILE


def registry(root: Path = EVALSETS_DIR) -> dict[str, EvalSetInfo]:
    """Every folder under `root` that holds a task.yaml, by folder name."""
    return {
        path.parent.name: EvalSetInfo(name=path.parent.name, folder=path.parent)
        for path in sorted(root.glob(f"*/{TASK_FILE}"))
    }


def get_evalset(name: str) -> EvalSetInfo:
    sets = registry()
    if name not in sets:
        raise SpecError(f"unknown eval set {name!r}: {did_you_mean(name, tuple(sets))}")
    return sets[name]


class EvalSetSpec(BaseModel):
    """One eval set to run on every stage, as written in the candidate spec."""

    model_config = {"extra": "forbid"}

    name: str = Field(description="A built-in eval set (a folder under evalsets/), e.g. 'math'.")
    limit: int | None = Field(default=None, gt=0, description="Use only the first N items.")
    max_gen_toks: int | None = Field(
        default=None, gt=0, description="Override the task's generation budget in tokens."
    )

    groups: list[str] | None = Field(
        default=None,
        min_length=1,
        description="Use only items of these groups (e.g. long-context buckets '512', '1k').",
    )

    @field_validator("name")
    @classmethod
    def _known(cls, name: str) -> str:
        sets = registry()
        if name not in sets:
            # ValueError so pydantic reports the field; callers see the valid names in the message.
            raise ValueError(f"unknown eval set {name!r}: {did_you_mean(name, tuple(sets))}")
        return name

    @property
    def info(self) -> EvalSetInfo:
        return get_evalset(self.name)
