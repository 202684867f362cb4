"""lm-eval's own tasks by name (`{lm_eval: gsm8k, num_fewshot: 5}`): config, data, item identity.

The task's config is lm-eval's own YAML, found through lm-eval's index of its built-in tasks
(kept on the machine per lm-eval version); the data come from the local Hugging Face cache, or
from a local folder the spec names (`data:`), never from the Hub: every load runs with
HF_HUB_OFFLINE / HF_DATASETS_OFFLINE set. Items pair across stages on lm-eval's own document
identity: the doc's index in the evaluated docs and the hash lm-eval logs of its content
(`doc_id`, `doc_hash`).

Kinds: `generate_until` tasks run on either endpoint; `multiple_choice` and `loglikelihood`
score prompt log-probabilities, which only the completions endpoint returns (chat_template:
false; the runner then tokenizes with the model's tokenizer, as for a `choice` set);
`loglikelihood_rolling` (corpus perplexity) is refused: quantgate measures that itself.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infra.errors import SpecError

INSTALL_HINT = "lm-eval is missing: pip install 'lm-eval[api]'"
GENERATIVE = ("generate_until",)
LOGLIKELIHOOD = ("multiple_choice", "loglikelihood")
SUPPORTED = GENERATIVE + LOGLIKELIHOOD
# A local data folder holds one file per split the task reads, e.g. test.jsonl and train.jsonl.
SPLIT_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
_SPLIT_KEYS = ("test_split", "validation_split", "training_split", "fewshot_split")


@contextlib.contextmanager
def offline() -> Iterator[None]:
    """No Hub access: the environment for lm-eval and datasets, and their already-read flags;
    datasets' progress bars off."""
    saved = {key: os.environ.get(key) for key in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")}
    os.environ.update({key: "1" for key in saved})
    import datasets.config
    import huggingface_hub.constants

    flags = [(datasets.config, "HF_HUB_OFFLINE"), (datasets.config, "HF_DATASETS_OFFLINE"),
             (huggingface_hub.constants, "HF_HUB_OFFLINE")]
    before = [getattr(module, name) for module, name in flags]
    for module, name in flags:
        setattr(module, name, True)
    bars = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()  # "Generating test split": not a line for validate's reader
    try:
        yield
    finally:
        if bars:
            datasets.enable_progress_bars()
        for (module, name), value in zip(flags, before, strict=True):
            setattr(module, name, value)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


# Bump when the stored index's layout changes.
INDEX_VERSION = 1


@dataclass(frozen=True)
class IndexEntry:
    """One name in lm-eval's task index: a task, a Python task, a group or a tag."""

    kind: str  # lm_eval.tasks._index.Kind's name: TASK, PY_TASK, GROUP, TAG
    yaml_path: str | None
    tags: tuple[str, ...]


def _index_file(version: str) -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    key = hashlib.sha256(f"{INDEX_VERSION}|{version}".encode()).hexdigest()[:16]
    return Path(root) / "quantgate" / f"lmeval-tasks-{key}.json"


@functools.cache
def task_index() -> dict[str, IndexEntry]:
    """lm-eval's built-in task index, as its TaskManager builds it (TaskIndex.build parses every
    YAML it ships, ~14,000 files: 10-20 s on 2 cores), kept on this machine per lm-eval version
    (its task YAMLs are files of the released package), YAML paths relative to its tasks folder."""
    try:
        import lm_eval
        from lm_eval.tasks._index import TaskIndex
    except ImportError as exc:
        raise SpecError(INSTALL_HINT) from exc
    tasks_dir = Path(lm_eval.__file__).resolve().parent / "tasks"
    stored = _index_file(lm_eval.__version__)
    try:
        return {name: IndexEntry(e["kind"], e["yaml_path"] and str(tasks_dir / e["yaml_path"]),
                                 tuple(e["tags"]))
                for name, e in json.loads(stored.read_text()).items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass  # not built yet on this machine, or unreadable: build it again
    built = TaskIndex.build([tasks_dir])
    with contextlib.suppress(OSError):  # a read-only home: the index is built each time
        stored.parent.mkdir(parents=True, exist_ok=True)
        scratch = stored.with_name(f"{stored.name}.{os.getpid()}")
        scratch.write_text(json.dumps({
            name: {"kind": e.kind.name, "tags": sorted(e.tags),
                   "yaml_path": e.yaml_path and str(Path(e.yaml_path).relative_to(tasks_dir))}
            for name, e in built.items()}))
        os.replace(scratch, stored)
    return {name: IndexEntry(e.kind.name, e.yaml_path and str(e.yaml_path), tuple(sorted(e.tags)))
            for name, e in built.items()}


def task_yaml(task: str) -> Path:
    """The YAML file of one lm-eval task; a group, tag or unknown name is refused in one line."""
    index = task_index()
    entry = index.get(task)
    if entry is None:
        tasks = [name for name, e in index.items() if e.kind in ("TASK", "PY_TASK")]
        close = difflib.get_close_matches(task, tasks, n=3)
        hint = f"did you mean {', '.join(map(repr, close))}?" if close else \
            "`python -m lm_eval ls tasks` lists them"
        raise SpecError(f"lm_eval: {task!r} is not an lm-eval task; {hint}")
    if entry.kind in ("GROUP", "TAG"):
        members = [name for name, e in index.items() if task in e.tags and e.kind == "TASK"][:3]
        example = f" (e.g. {', '.join(map(repr, members))})" if members else ""
        raise SpecError(f"lm_eval: {task!r} is an lm-eval group of tasks; name one of its "
                        f"tasks{example}: each set is one task, scored and paired on its own")
    if entry.yaml_path is None:
        raise SpecError(f"lm_eval: {task!r} is a Python-only lm-eval task without a YAML config; "
                        "quantgate runs YAML tasks")
    return Path(entry.yaml_path)


def raw_config(task: str) -> dict[str, Any]:
    """The task's config with its includes merged, `!function` names kept as text."""
    from lm_eval.tasks._yaml_loader import load_yaml

    return load_yaml(task_yaml(task), resolve_func=False)


def local_splits(config: dict[str, Any], folder: Path) -> dict[str, Path] | None:
    """The split files of a local data folder, by the split names the config reads; None when
    the folder holds none of them (then it is a copy of the Hub dataset's repository)."""
    wanted = list(dict.fromkeys(config[key] for key in _SPLIT_KEYS if config.get(key)))
    present = {split: [folder / f"{split}{suffix}" for suffix in SPLIT_FORMATS
                       if (folder / f"{split}{suffix}").is_file()] for split in wanted}
    if not any(present.values()):
        return None
    found = {split: files[0] for split, files in present.items() if files}
    missing = [split for split in wanted if split not in found]
    suffixes = {path.suffix for files in present.values() for path in files}
    if missing or len(suffixes) > 1:
        problem = (f"no {', '.join(missing)} split" if missing
                   else f"mixed formats {', '.join(sorted(suffixes))}")
        raise SpecError(f"data: {folder}: {problem}; the task reads splits "
                        f"{', '.join(wanted)}: put them as {', '.join(s + '.jsonl' for s in wanted)}"
                        " (or .parquet, .csv), one format")
    return found


def task_config(spec: Any) -> dict[str, Any]:
    """The lm-eval config of a named-task set, functions resolved, the spec's overrides applied:
    a local data folder, the few-shot count, the generation budget."""
    from lm_eval.tasks._yaml_loader import load_yaml

    path = task_yaml(spec.lm_eval)
    try:  # its `!function` modules are imported: some load a metric or data of their own
        with offline():
            config = load_yaml(path, resolve_func=True)
    except Exception as exc:  # noqa: BLE001 - whatever a task's own module raises
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise SpecError(f"lm_eval: task {spec.lm_eval!r}: its config ({path}) cannot be loaded "
                        f"offline: {type(exc).__name__}: {first}") from exc
    for key in ("tag", "group", "task_list"):
        config.pop(key, None)
    kind = config.get("output_type", "generate_until")
    if kind not in SUPPORTED:
        raise SpecError(f"lm_eval: {spec.lm_eval!r} is a {kind} task, which quantgate does not "
                        f"run (it runs {', '.join(SUPPORTED)}; corpus perplexity it measures "
                        "itself)")
    if spec.data is not None:
        splits = local_splits(config, spec.data)
        if splits is None:  # a local copy of the dataset's Hub repository
            config["dataset_path"] = str(spec.data)
        else:
            config["dataset_path"] = SPLIT_FORMATS[next(iter(splits.values())).suffix]
            config["dataset_name"] = None
            config["dataset_kwargs"] = {"data_files": {s: str(p) for s, p in splits.items()}}
    if spec.num_fewshot is not None:
        config["num_fewshot"] = spec.num_fewshot
    if spec.max_gen_toks is not None:
        config.setdefault("generation_kwargs", {})["max_gen_toks"] = spec.max_gen_toks
    return config


def filter_names(config: dict[str, Any]) -> list[str]:
    """The task's filters in order (lm-eval logs each item once per filter); 'none' without."""
    return [entry["name"] for entry in config.get("filter_list") or []] or ["none"]


def chosen_filter(spec: Any, config: dict[str, Any]) -> str:
    names = filter_names(config)
    if spec.filter is None:
        return names[0]
    if spec.filter not in names:
        close = difflib.get_close_matches(spec.filter, names, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise SpecError(f"eval set {spec.name!r}: filter {spec.filter!r} is not one of lm-eval "
                        f"task {spec.lm_eval!r}'s; {hint}(valid: {', '.join(names)})")
    return spec.filter


@dataclass(frozen=True)
class TaskData:
    """What `validate` found of a named task's data, offline."""

    task: str
    kind: str
    filter: str
    pool: int
    source: str

    def line(self, name: str) -> str:
        return (f"eval set {name}: lm-eval task {self.task} ({self.kind}, filter {self.filter}), "
                f"{self.pool} items, data offline from {self.source}")


def _where_to_put(spec: Any, config: dict[str, Any]) -> str:
    import datasets.config

    path, name = config.get("dataset_path"), config.get("dataset_name")
    splits = sorted({config[key] for key in _SPLIT_KEYS if config.get(key)})
    loader = f"datasets.load_dataset({path!r}{f', {name!r}' if name else ''})"
    return (f"put it in the Hugging Face cache ({datasets.config.HF_DATASETS_CACHE}): on a "
            f"connected machine run python -c \"import datasets; {loader}\" with the same HF_HOME "
            f"and copy the cache here; or give the set `data:` a folder with "
            f"{', '.join(s + '.jsonl' for s in splits)} (or .parquet)")


def _source(spec: Any, task: Any) -> str:
    if spec.data is not None:
        return str(spec.data)
    files = [f["filename"] for split in task.dataset.values() for f in split.cache_files]
    return str(Path(files[0]).parent) if files else "the Hugging Face cache"


@functools.cache
def _check(spec_type: Any, spec_json: str) -> TaskData:
    spec = spec_type.model_validate_json(spec_json)  # an EvalSetSpec: the cache keys on its JSON
    config = task_config(spec)
    kind = config.get("output_type", "generate_until")
    chosen = chosen_filter(spec, config)
    try:
        from lm_eval.api.task import ConfigurableTask

        with offline():
            task = ConfigurableTask(config=config)
            docs = task.eval_docs
    except Exception as exc:  # datasets raises anything from ConnectionError to FileNotFoundError
        if spec.data is not None:
            where = f"from data {spec.data}: {type(exc).__name__}: {str(exc).splitlines()[0]}"
        else:
            where = (f"({config.get('dataset_path')}"
                     f"{'/' + config['dataset_name'] if config.get('dataset_name') else ''}) is "
                     f"not available offline; {_where_to_put(spec, config)}")
        raise SpecError(f"eval set {spec.name!r}: lm-eval task {spec.lm_eval!r}: its data "
                        f"{where}") from exc
    if len(docs) == 0:
        raise SpecError(f"eval set {spec.name!r}: lm-eval task {spec.lm_eval!r} has no test docs")
    return TaskData(spec.lm_eval, kind, chosen, len(docs), _source(spec, task))


def check_data(spec: Any) -> TaskData:
    """Build the task offline, as the run will: its docs (the set's pool) and where they came
    from; SpecError naming the task and where to put its data when they are not here."""
    return _check(type(spec), spec.model_dump_json())


def endpoint_problem(sets: list[Any], chat_template: bool) -> str | None:
    """Why a named task cannot run on the endpoint the spec asks for, or None: a log-likelihood
    task needs prompt log-probabilities, which the chat endpoint does not return."""
    if not chat_template:
        return None
    for spec in sets:
        if spec.lm_eval is None:
            continue
        kind = raw_config(spec.lm_eval).get("output_type", "generate_until")
        if kind in LOGLIKELIHOOD:
            return (f"evalsets: {spec.name!r} (lm-eval {spec.lm_eval}) is a {kind} task: it "
                    "scores prompt log-probabilities, which the chat endpoint does not return; "
                    "set chat_template: false (the completions endpoint) or name a "
                    "generate_until task")
    return None


def identified(samples: list[dict[str, Any]], chosen: str, start: int) -> list[dict[str, Any]]:
    """The samples of one filter, each doc given lm-eval's identity as its `id`: its index in
    the set (`start` + doc_id in a later batch) and lm-eval's hash of its content."""
    out = []
    for sample in samples:
        if sample.get("filter", "none") != chosen:
            continue
        doc_id = int(sample["doc_id"]) + start
        digest = sample.get("doc_hash") or hashlib.sha256(
            json.dumps(sample["doc"], sort_keys=True, default=str).encode()).hexdigest()
        out.append(sample | {"doc_id": doc_id,
                             "doc": dict(sample["doc"]) | {"id": f"{doc_id}:{digest[:12]}"}})
    return out


def data_digest(spec: Any) -> str:
    """What the stage cache key takes of a named task: lm-eval's version, the task's YAML and its
    data (the local folder's files, or the cached dataset's fingerprints)."""
    import lm_eval

    from infra.digest import folder_digest

    parts = [lm_eval.__version__, json.dumps(raw_config(spec.lm_eval), sort_keys=True, default=str)]
    if spec.data is not None:
        parts.append(folder_digest(spec.data) if spec.data.is_dir() else "")
    else:
        parts.append(check_data(spec).source)
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()
