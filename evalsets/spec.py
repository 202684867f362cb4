"""Which eval sets a candidate is measured on, and the registry of the built-in ones.

A built-in set is a folder `evalsets/<name>/` holding an lm-eval `task.yaml` and its local data;
adding a business, code or long-context set means adding such a folder, nothing else. A spec can
also bring its own set by `path`: such a folder anywhere, or a plain data file (JSONL, CSV,
Parquet) with a declared scorer (evalsets/scorers.py, evalsets/userset.py); or name one of
lm-eval's own tasks (`lm_eval: gsm8k`, evalsets/lmeval_task.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, Field, ValidationInfo, field_validator, model_validator

from evalsets.sampling import Sampling
from evalsets.scorers import SCORER_KINDS, Scorer
from infra.errors import SpecError, did_you_mean

EVALSETS_DIR = Path(__file__).resolve().parent
TASK_FILE = "task.yaml"
DATA_SUFFIXES = (".jsonl", ".csv", ".parquet")


@dataclass(frozen=True)
class EvalSetInfo:
    """An eval set on disk: a folder with a task.yaml, or a user's data file and its scorer."""

    name: str
    folder: Path
    data_file: Path | None = None
    scorer: Scorer | None = None
    prompt_field: str | None = None
    id_field: str = "id"
    group_field: str | None = None
    cluster_field: str | None = None
    lm_eval: str | None = None  # an lm-eval task by name: its config and data are lm-eval's

    @property
    def task_yaml(self) -> Path:
        """The file that declares the set: its task.yaml, or the user's data file."""
        return self.data_file or self.folder / TASK_FILE


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




def resolve_path(path: Path | None, info: ValidationInfo) -> Path | None:
    """A relative path is relative to the spec file (validation context `base_dir`)."""
    base = (info.context or {}).get("base_dir")
    if path is None or path.is_absolute() or base is None:
        return path
    try:
        return (Path(base) / path).resolve()
    except (RuntimeError, OSError) as err:  # a symlink loop (RuntimeError before Python 3.13)
        raise ValueError(f"{path} cannot be followed ({err}); point the symlink at the real "
                         "folder or file") from err


# The fields that describe your own data file; a folder set or an lm-eval task declares them itself.
DATA_FILE_FIELDS = ("scorer", "prompt_field", "id_field", "group_field", "cluster_field")


class EvalSetSpec(BaseModel):
    """One eval set to run on every stage, as written in the candidate spec."""

    model_config = {"extra": "forbid"}

    name: str = Field(description="A built-in eval set (a folder under evalsets/), e.g. 'math'; "
                                  "with `path` or `lm_eval`, the set's label in results and "
                                  "reports (default for `lm_eval`: the task's name).")
    path: Path | None = Field(
        default=None, description="Your own set: a folder with an lm-eval task.yaml, or a data "
                                  "file (.jsonl, .csv, .parquet) scored by `scorer`; relative to "
                                  "the spec file.")
    scorer: Scorer | None = Field(default=None, description="How a data file's rows are scored.")
    prompt_field: str | None = Field(
        default=None, description="Data file: the field holding the prompt (default 'prompt'; a "
                                  "'messages' field of {role, content} turns is a dialogue).")
    id_field: str | None = Field(default=None, description="Data file: the item id field ('id').")
    group_field: str | None = Field(
        default=None, description="Data file: a field naming each item's group (a difficulty, a "
        "length bucket): groups are strata of the set's interval and are shown per group.")
    cluster_field: str | None = Field(
        default=None, description="Data file: a field naming each item's cluster of "
        "near-duplicates (a template, a source document): intervals count clusters, not items.")
    limit: int | None = Field(default=None, gt=0, description="Use only the first N items.")
    max_gen_toks: int | None = Field(
        default=None, gt=0, description="Override the task's generation budget in tokens."
    )

    groups: list[str] | None = Field(
        default=None,
        min_length=1,
        description="Use only items of these groups (e.g. long-context buckets '512', '1k').",
    )

    sampling: Sampling | None = Field(
        default=None, description="Sample each item k times (a reasoning model, evaluated as its "
        "maker does) instead of greedy decoding: the item's score is the mean of its samples.")
    reasoning_end: str | None = Field(
        default=None, min_length=1, description="The text that closes a reasoning trace (e.g. "
        "'</think>'): what precedes it is split off before scoring and its length judged by a "
        "length rule of its own. An engine served with a --reasoning-parser returns the trace "
        "apart and needs none.")

    lm_eval: str | None = Field(
        default=None, description="One of lm-eval's own tasks by name (e.g. 'gsm8k'), run with "
        "lm-eval's task config and paired on its document identity; `name` defaults to it.")
    num_fewshot: int | None = Field(
        default=None, ge=0, description="lm_eval: few-shot examples per prompt (default: the "
                                        "task's own).")
    filter: str | None = Field(
        default=None, description="lm_eval: which of the task's answer filters scores (e.g. "
                                  "gsm8k's 'flexible-extract'; default: its first).")
    data: Path | None = Field(
        default=None, description="lm_eval: a local folder with the task's data instead of the "
        "Hugging Face cache: one file per split it reads (test.jsonl, train.jsonl, or .parquet, "
        ".csv), or a copy of the dataset's Hub repository; relative to the spec file.")

    resolve = field_validator("path", "data")(resolve_path)

    @model_validator(mode="before")
    @classmethod
    def _named_by_task(cls, value: object) -> object:
        if isinstance(value, dict) and value.get("lm_eval") and "name" not in value:
            return value | {"name": value["lm_eval"]}
        return value

    def first_look(self, pool: int) -> int:
        """Items scored at the first look, of a set holding `pool`: its limit, within the pool."""
        return min(self.limit or pool, pool)

    @model_validator(mode="after")
    def _known(self) -> EvalSetSpec:
        sets = registry()
        if self.sampling is not None and getattr(self.scorer, "kind", None) == "choice":
            raise ValueError(f"eval set {self.name!r}: a choice set is scored by log-likelihood, "
                             "nothing is sampled; drop `sampling`")
        if self.lm_eval is not None:
            return self._named_task(sets)
        named = self._given("num_fewshot", "filter", "data")
        if named:
            raise ValueError(f"eval set {self.name!r}: {', '.join(named)} only apply to an "
                             "lm-eval task named by `lm_eval`")
        if self.path is None:
            if self.name not in sets:
                # ValueError so pydantic reports the field; callers see the valid names.
                raise ValueError(f"unknown eval set {self.name!r}: {did_you_mean(self.name, tuple(sets))}"
                                 " (or give `path` to bring your own set)")
            extra = self._given(*DATA_FILE_FIELDS)
            if extra:
                raise ValueError(f"eval set {self.name!r}: {', '.join(extra)} only apply to your "
                                 "own data file (`path`)")
            return self
        if self.name in sets:
            raise ValueError(f"eval set name {self.name!r} is a built-in set; give your set "
                             "another name (it labels its results)")
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]*", self.name):
            raise ValueError(f"eval set name {self.name!r}: letters, digits, '_' and '-' only "
                             "(it names result folders and MLflow metrics)")
        if self.path.is_dir():
            if not (self.path / TASK_FILE).is_file():
                raise ValueError(f"path {str(self.path)!r}: a folder needs an lm-eval {TASK_FILE}; "
                                 f"or point path at a data file ({', '.join(DATA_SUFFIXES)})")
            extra = self._given(*DATA_FILE_FIELDS)
            if extra:
                raise ValueError(f"eval set {self.name!r}: {', '.join(extra)} apply to a data file; "
                                 f"the folder's {TASK_FILE} (and contract.yaml) declare them")
        elif not self.path.is_file():
            raise ValueError(f"path {str(self.path)!r} does not exist")
        elif self.path.suffix not in DATA_SUFFIXES:
            raise ValueError(f"path {str(self.path)!r}: unsupported data file (valid: "
                             f"{', '.join(DATA_SUFFIXES)}, or a folder with a {TASK_FILE})")
        elif self.scorer is None:
            raise ValueError(f"eval set {self.name!r}: a data file needs a scorer (kind: "
                             f"{', '.join(SCORER_KINDS)})")
        elif self.groups is not None:
            raise ValueError(f"eval set {self.name!r}: 'groups' needs a folder set whose "
                             "contract.yaml declares a group field")
        return self

    def _given(self, *fields: str) -> list[str]:
        """Those of `fields` the spec sets (not None)."""
        return [f for f in fields if getattr(self, f) is not None]

    def _named_task(self, sets: dict[str, EvalSetInfo]) -> EvalSetSpec:
        from evalsets.lmeval_task import task_yaml

        extra = self._given("path", *DATA_FILE_FIELDS, "groups")
        if extra:
            raise ValueError(f"eval set {self.name!r}: {', '.join(extra)} do not apply to an "
                             "lm-eval task (its config and data are lm-eval's; `data` points at "
                             "a local copy)")
        if self.name in sets:
            raise ValueError(f"eval set name {self.name!r} is a built-in set; give the lm-eval "
                             "task another `name` (it labels its results)")
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]*", self.name):
            raise ValueError(f"eval set name {self.name!r}: letters, digits, '_' and '-' only "
                             "(it names result folders and MLflow metrics); give `name`")
        if self.data is not None and not self.data.is_dir():
            raise ValueError(f"data {str(self.data)!r} is not a folder (it holds the task's "
                             "splits, e.g. test.jsonl and train.jsonl)")
        try:
            task_yaml(self.lm_eval)
        except SpecError as err:
            raise ValueError(str(err)) from err
        return self

    @property
    def info(self) -> EvalSetInfo:
        if self.lm_eval is not None:
            return EvalSetInfo(name=self.name, folder=self.data or EVALSETS_DIR,
                               lm_eval=self.lm_eval)
        if self.path is None:
            return get_evalset(self.name)
        if self.path.is_dir():
            return EvalSetInfo(name=self.name, folder=self.path)
        return EvalSetInfo(name=self.name, folder=self.path.parent, data_file=self.path,
                           scorer=self.scorer, prompt_field=self.prompt_field,
                           id_field=self.id_field or "id", group_field=self.group_field,
                           cluster_field=self.cluster_field)
