"""Data contracts of the eval sets: Great Expectations suites run before any engine starts.

What a set's rows must hold is declared, not coded: a `contract.yaml` next to the set's
`task.yaml` names the id field, the fields that feed the prompt, the reference fields, and
optionally a group field with per-group token-length bounds (long-context buckets). Without a
`contract.yaml` the contract is read off `task.yaml`: the id is `id`, the prompt fields are the
template variables of `doc_to_text`, the references those of `doc_to_target`.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, Field, model_validator

from evalsets import lmeval_task, userset
from evalsets.multiturn import is_multiturn
from evalsets.spec import EVALSETS_DIR, EvalSetInfo, EvalSetSpec
from evalsets.task_code import FunctionRef, check_reference, check_task_functions, check_task_patterns
from evalsets.userset import LINE, prompt_field, read_rows
from infra.errors import SpecError, did_you_mean
from infra.yamlfile import StrictLoader, load_model

CONTRACT_FILE = "contract.yaml"
INSTALL_HINT = "great_expectations is missing: pip install great-expectations"
# Chat template tokens around the prompt, with room to spare (SmolLM2's ChatML adds 30).
TEMPLATE_MARGIN_TOKENS = 64
_TEMPLATE_VAR = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)")
_NOT_BLANK = r"\S"


class LengthRule(BaseModel):
    """Every row's measured token count lies inside its group's declared bounds."""

    model_config = {"extra": "forbid"}

    field: str = Field(description="Column with the prompt's token count measured at generation.")
    bounds: dict[str, tuple[int, int]] = Field(
        description="Group name -> [min, max] prompt tokens (without the chat template)."
    )

    @model_validator(mode="after")
    def _ordered(self) -> LengthRule:
        for group, (low, high) in self.bounds.items():
            if not 0 < low <= high:
                raise ValueError(f"bounds of group {group!r} must satisfy 0 < min <= max")
        return self


class Contract(BaseModel):
    """What every row of an eval set must hold."""

    model_config = {"extra": "forbid"}

    id: str = Field(default="id", description="Unique, stable item id (pairs items across stages).")
    prompt: list[str] = Field(min_length=1, description="Fields that feed the prompt: non-empty.")
    reference: list[str] = Field(
        default_factory=list, description="Reference answer fields: present and non-empty."
    )
    group: str | None = Field(
        default=None, description="Field naming the item's sub-group (QualityItem.group)."
    )
    cluster: str | None = Field(
        default=None, description="Field naming the item's cluster of near-duplicates, e.g. its "
        "template (QualityItem.cluster): the gates' intervals resample clusters, not items."
    )
    lengths: LengthRule | None = Field(default=None, description="Token-length bounds per group.")
    check: str | None = Field(
        default=None, pattern=r"^[A-Za-z_]\w*\.[A-Za-z_]\w*$",
        description="module.function in the set's folder that reads one data file and raises "
                    "SpecError naming the line and field of a row its scorer cannot use.")

    @model_validator(mode="after")
    def _lengths_need_group(self) -> Contract:
        if self.lengths is not None and self.group is None:
            raise ValueError("'lengths' needs 'group': bounds are declared per group")
        return self

    @property
    def fields(self) -> list[str]:
        extra = [field for field in (self.group, self.cluster) if field]
        extra += [self.lengths.field] if self.lengths else []
        return list(dict.fromkeys([self.id, *self.prompt, *self.reference, *extra]))


class _TaskLoader(StrictLoader):
    """Reads lm-eval task YAML without lm-eval: `!function x.y` stays the string 'x.y'; a
    repeated key is an error, as in every YAML file quantgate reads."""


_TaskLoader.add_constructor("!function",
                            lambda loader, node: FunctionRef(loader.construct_scalar(node)))


def read_task_yaml(info: EvalSetInfo) -> dict[str, Any]:
    """The set's task.yaml (`!function` names kept as text); a user data file's equivalent."""
    if info.lm_eval is not None:
        return lmeval_task.raw_config(info.lm_eval)
    if info.data_file is not None:
        return userset.task_yaml(info)
    return _read_task_file(info.task_yaml)


def _read_task_file(path: Path) -> dict[str, Any]:
    try:
        config = yaml.load(path.read_text(), Loader=_TaskLoader)  # noqa: S506
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise SpecError(f"{path}: cannot read: {exc}".replace("\n", " ")) from exc
    if not isinstance(config, dict):
        raise SpecError(f"{path}: expected a mapping at the top level")
    return config


MAX_INCLUDE_DEPTH = 16


def task_files(task_yaml: Path, config: dict[str, Any],
               within: tuple[Path, ...] = ()) -> list[tuple[Path, dict[str, Any]]]:
    """The task.yaml and every file its `include:` names (lm-eval's reuse, relative to the
    including file), each read as data; a cycle or a missing file is a SpecError."""
    chain = (*within, task_yaml.resolve())
    if len(chain) > MAX_INCLUDE_DEPTH:
        raise SpecError(f"{task_yaml}: include nests more than {MAX_INCLUDE_DEPTH} files deep")
    found = [(task_yaml, config)]
    names = config.get("include")
    names = [] if names is None else [names] if isinstance(names, str) else names
    if not (isinstance(names, list) and all(isinstance(name, str) for name in names)):
        raise SpecError(f"{task_yaml}: include is {config.get('include')!r}; name a YAML file, or "
                        "a list of them, relative to this one")
    for name in names:
        path = task_yaml.parent / name
        if path.resolve() in chain:
            raise SpecError(f"{task_yaml}: include {name!r} includes itself again (a cycle); "
                            "remove the include")
        if not path.is_file():
            raise SpecError(f"{task_yaml}: include {name!r}: no such file {path}")
        found += task_files(path, _read_task_file(path), chain)
    return found


def _template_fields(template: object) -> list[str]:
    return list(dict.fromkeys(_TEMPLATE_VAR.findall(template))) if isinstance(template, str) else []


def _user_contract(info: EvalSetInfo) -> Contract:
    """The data contract a user data file implies: id, prompt and the scorer's fields."""
    return Contract(id=info.id_field, prompt=[prompt_field(info)], reference=info.scorer.fields,
                    group=info.group_field, cluster=info.cluster_field)


def load_contract(info: EvalSetInfo) -> Contract:
    """The set's `contract.yaml`, or the contract implied by its `task.yaml` (or by a user data
    file's declared fields); an lm-eval task's items are its docs, by lm-eval's identity."""
    if info.lm_eval is not None:
        return Contract(id="doc_id", prompt=_template_fields(
            read_task_yaml(info).get("doc_to_text")) or ["doc"])
    if info.data_file is not None:
        return _user_contract(info)
    path = info.folder / CONTRACT_FILE
    if path.is_file():
        return load_model(path, Contract)
    config = read_task_yaml(info)
    prompt = _template_fields(config.get("doc_to_text"))
    if not prompt:
        raise SpecError(
            f"{info.task_yaml}: doc_to_text is not a template with {{{{field}}}} names; declare "
            f"the prompt fields in {info.folder / CONTRACT_FILE}"
        )
    return Contract(prompt=prompt, reference=_template_fields(config.get("doc_to_target")))


def data_files(info: EvalSetInfo) -> list[Path]:
    """The set's local data files (relative paths are read from the set's folder); none for an
    lm-eval task, whose data lm-eval reads (evalsets.lmeval_task.check_data checks them)."""
    if info.lm_eval is not None:
        return []
    config = read_task_yaml(info)
    files = (config.get("dataset_kwargs") or {}).get("data_files")
    if isinstance(files, dict):
        names = [name for value in files.values()
                 for name in ([value] if isinstance(value, str) else value)]
    elif isinstance(files, str):
        names = [files]
    elif isinstance(files, list):
        names = files
    else:
        raise SpecError(f"{info.task_yaml}: dataset_kwargs.data_files names no local file")
    return [(info.folder / name).resolve() for name in names]


def _read_rows(path: Path) -> Any:
    """The data file as a frame; JSONL, CSV and Parquet rows carry their line (`__line`)."""
    import pandas as pd

    if not path.is_file():
        raise SpecError(f"{path}: data file not found")
    if path.suffix in (".jsonl", ".csv", ".parquet"):
        return pd.DataFrame(read_rows(path))
    if path.suffix == ".json":
        try:
            return pd.read_json(path, dtype=False)
        except ValueError as exc:
            raise SpecError(f"{path}: cannot parse: {exc}".replace("\n", " ")) from exc
    raise SpecError(f"{path}: unsupported data format {path.suffix!r} "
                    "(valid: .jsonl, .json, .csv, .parquet)")


def _expectations(contract: Contract) -> list[tuple[str, Any]]:
    """(rule, expectation) pairs; the rule text is what a broken row is reported with."""
    import great_expectations as gx

    ex = gx.expectations
    rules: list[tuple[str, Any]] = [
        (f"'{contract.id}' is unique", ex.ExpectColumnValuesToBeUnique(column=contract.id)),
        (f"'{contract.id}' is present", ex.ExpectColumnValuesToNotBeNull(column=contract.id)),
    ]
    for kind, columns in (("prompt", contract.prompt), ("reference", contract.reference)):
        for column in columns:
            rules.append((f"{kind} field '{column}' is present and not blank",
                          ex.ExpectColumnValuesToMatchRegex(column=f"{column}__text",
                                                            regex=_NOT_BLANK)))
    if contract.lengths is not None:
        group, field = contract.group, contract.lengths.field
        groups = sorted(contract.lengths.bounds)
        rules.append((f"'{field}' is a number", ex.ExpectColumnValuesToNotBeNull(column=field)))
        rules.append((f"'{group}' is a declared group ({', '.join(groups)})",
                      ex.ExpectColumnValuesToBeInSet(column=group, value_set=groups)))
        rules.append((f"'{field}' is at least its group's minimum",
                      ex.ExpectColumnPairValuesAToBeGreaterThanB(
                          column_A=field, column_B="__min_tokens", or_equal=True,
                          ignore_row_if="either_value_is_missing")))
        rules.append((f"'{field}' is at most its group's maximum",
                      ex.ExpectColumnPairValuesAToBeGreaterThanB(
                          column_A="__max_tokens", column_B=field, or_equal=True,
                          ignore_row_if="either_value_is_missing")))
    return rules


def _prepared(frame: Any, contract: Contract, path: Path) -> Any:
    """The frame with helper columns: stringified prompt/reference text, per-row bounds."""
    import pandas as pd

    missing = [column for column in contract.fields if column not in frame.columns]
    if missing:
        raise SpecError(f"{path}: no field {missing[0]!r} in any row (contract needs: "
                        f"{', '.join(contract.fields)})")
    frame = frame.copy()
    frame["__row"] = range(1, len(frame) + 1)
    if LINE not in frame.columns:
        frame[LINE] = frame["__row"]
    # Items pair across stages by str(id): 7 and "7" are the same item, so unique means unique
    # after str().
    frame[contract.id] = frame[contract.id].map(
        lambda v: None if v is None or (isinstance(v, float) and math.isnan(v)) else str(v))
    for column in [*contract.prompt, *contract.reference]:
        frame[f"{column}__text"] = frame[column].map(
            lambda v: "" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v))
    if contract.lengths is not None:
        bounds = contract.lengths.bounds
        frame[contract.lengths.field] = pd.to_numeric(frame[contract.lengths.field], errors="coerce")
        for end, column in enumerate(("__min_tokens", "__max_tokens")):
            frame[column] = frame[contract.group].map(
                lambda g, end=end: bounds[str(g)][end] if str(g) in bounds else math.nan
            ).astype("float64")
    return frame


def _first_failure(result: Any, id_column: str, source: str) -> str:
    """'FILE:LINE: row N (id X)' of the first row an expectation flagged, with the offending
    value (LINE: the data file's line, a CSV's header counted)."""
    details = result.result or {}
    flagged = details.get("partial_unexpected_index_list") or details.get("unexpected_index_list")
    values = details.get("partial_unexpected_list") or []
    shown = f", value {values[0]!r}" if values else ""
    if flagged and isinstance(flagged[0], dict) and "__row" in flagged[0]:
        first = flagged[0]
        return (f"{source}:{int(first[LINE])}: row {int(first['__row'])} "
                f"(id {first.get(id_column)!r}{shown})")
    return f"{source}: unexpected values{shown}"


def validate_frame(frame: Any, contract: Contract, source: str) -> None:
    """Run the contract's suite on one data frame; raise SpecError on the first broken rule."""
    try:
        os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
        import great_expectations as gx
    except ImportError as exc:
        raise SpecError(INSTALL_HINT) from exc
    # Its modules set their own INFO level ("Created temporary directory … for ephemeral docs").
    for name in [*logging.root.manager.loggerDict, "great_expectations"]:
        if name.startswith("great_expectations"):
            logging.getLogger(name).setLevel(logging.ERROR)
    frame = _prepared(frame, contract, Path(source))
    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = {"globally": False, "metric_calculations": False}
    batch = (
        context.data_sources.add_pandas("contracts")
        .add_dataframe_asset("rows")
        .add_batch_definition_whole_dataframe("all")
        .get_batch(batch_parameters={"dataframe": frame})
    )
    rules = _expectations(contract)
    for rule, expectation in rules:
        result = batch.validate(expectation, result_format={
            "result_format": "SUMMARY",
            "unexpected_index_column_names": ["__row", LINE, contract.id]})
        if not result.success:
            where = _first_failure(result, contract.id, source)
            raise SpecError(f"{where}: broke rule {rule}")


def check_groups(spec: EvalSetSpec, contract: Contract) -> None:
    """A spec's `groups` must name groups the set declares."""
    if spec.groups is None:
        return
    if contract.group is None:
        raise SpecError(f"eval set {spec.name!r}: 'groups' given but the set declares no group "
                        f"field (add 'group' to {spec.info.folder / CONTRACT_FILE})")
    if contract.lengths is not None:
        for group in spec.groups:
            if group not in contract.lengths.bounds:
                raise SpecError(f"eval set {spec.name!r}: unknown group {group!r}: "
                                f"{did_you_mean(group, tuple(contract.lengths.bounds))}")


def row_check(folder: Path, check: str) -> Callable[[Path], Any]:
    """The set's own row checker, `module.function` from a file in its folder (imported)."""
    module_name, function = check.split(".")
    source = check_source(folder, check)
    name = f"_quantgate_check_{abs(hash(str(source.resolve())))}"
    module = sys.modules.get(name)
    if module is None:
        loaded = importlib.util.spec_from_file_location(name, source)
        module = importlib.util.module_from_spec(loaded)
        sys.modules[name] = module  # pydantic resolves the module's annotations through it
        loaded.loader.exec_module(module)
    if not callable(getattr(module, function, None)):
        raise SpecError(f"{folder / CONTRACT_FILE}: check {check!r}: {source.name} has no "
                        f"function {function!r}")
    return getattr(module, function)


def check_source(folder: Path, check: str) -> Path:
    """The file of a contract's `check`, read as text: it exists and defines the function."""
    source = folder / f"{check.split('.')[0]}.py"
    if not source.is_file():
        raise SpecError(f"{folder / CONTRACT_FILE}: check {check!r}: no {source.name} in the folder")
    check_reference(folder, check, f"{folder / CONTRACT_FILE}: check")
    return source


def builtin(info: EvalSetInfo) -> bool:
    """A set shipped in quantgate's own evalsets/ folder: its code is quantgate's, not a user's."""
    return info.data_file is None and info.folder.resolve().parent == EVALSETS_DIR


def validate_set(spec: EvalSetSpec, run_checks: bool = False) -> int:
    """Validate every data file of one set; returns the rows of the spec's groups (its pool).

    A user folder's code (its `!function`s, its contract's `check`) is read as text unless
    `run_checks` (a run, which imports it to score anyway): `validate` runs no user code."""
    info = spec.info
    if info.lm_eval is not None:
        return lmeval_task.check_data(spec).pool
    contract = load_contract(info)
    check_groups(spec, contract)
    if info.data_file is None:
        for path, config in task_files(info.task_yaml, read_task_yaml(info)):
            check_task_functions(path, config)
            check_task_patterns(path, config)
    run_checks = run_checks or builtin(info)
    if contract.check and not run_checks:
        check_source(info.folder, contract.check)
    rows = 0
    for path in data_files(info):
        frame = _read_rows(path)
        if frame.empty:
            raise SpecError(f"{path}: no rows")
        validate_frame(frame, contract, str(path))
        if contract.check and run_checks:
            row_check(info.folder, contract.check)(path)
        if info.data_file is not None:
            userset.check_rows(info, read_rows(path))
        if spec.groups is not None and contract.group in frame.columns:
            frame = frame[frame[contract.group].astype(str).isin(spec.groups)]
        rows += len(frame)
    return rows


def validate_sets(sets: list[EvalSetSpec], run_checks: bool = False) -> dict[str, int]:
    """Every selected set against its contract, before any engine starts (raises SpecError).

    Returns the items each set can draw on (its pool), by name."""
    return {spec.name: validate_set(spec, run_checks) for spec in sets}


MAX_PLAUSIBLE_CONTEXT = 1 << 20  # tokens: no engine serves a longer context today


def check_prompts_fit(sets: list[EvalSetSpec], max_model_len: int | None,
                      tokenizer_json: Path) -> None:
    """Every item of a set without length bounds fits the served context: its prompt fields'
    tokens (a lower bound of the prompt) plus the chat template and the generation budget."""
    if max_model_len is None or not tokenizer_json.is_file():
        return
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_json))
    for spec in sets:
        contract = load_contract(spec.info)
        if contract.lengths is not None:  # checked per group by fit_to_context
            continue
        budget = spec.max_gen_toks or int(
            (read_task_yaml(spec.info).get("generation_kwargs") or {}).get("max_gen_toks", 256))
        if budget + TEMPLATE_MARGIN_TOKENS >= max_model_len:  # no prompt fits: not a context
            where = "max_gen_toks" if spec.max_gen_toks else "its task's max_gen_toks"
            fix = f"give max_gen_toks at most {max(max_model_len - TEMPLATE_MARGIN_TOKENS - 1, 1):,}"
            if budget <= MAX_PLAUSIBLE_CONTEXT:  # a context that large can be served
                fix += (f", or raise engine.max_model_len above {budget + TEMPLATE_MARGIN_TOKENS:,}"
                        " with room for the prompts")
            raise SpecError(
                f"eval set {spec.name!r}: {where} {budget:,} leaves no room for a prompt in "
                f"engine.max_model_len {max_model_len:,} ({TEMPLATE_MARGIN_TOKENS} tokens go to "
                f"the template); {fix}")
        for path in data_files(spec.info):
            rows = prompt_rows(spec.info, path, contract)
            texts = [text for _, _, text in rows]
            counts = [len(e.ids) for e in tokenizer.encode_batch(texts, add_special_tokens=False)]
            longest = max(range(len(counts)), key=counts.__getitem__, default=None)
            if longest is None:
                continue
            needed = counts[longest] + TEMPLATE_MARGIN_TOKENS + budget
            if needed > max_model_len:
                item, line, _ = rows[longest]
                raise SpecError(
                    f"{path}:{line}: field {'+'.join(contract.prompt)!r} (id {item!r}): eval set "
                    f"{spec.name!r} needs {needed} tokens ({counts[longest]} prompt + "
                    f"{TEMPLATE_MARGIN_TOKENS} template + {budget} generated) but "
                    f"engine.max_model_len is {max_model_len}; raise it to at least {needed}")


def prompt_rows(info: EvalSetInfo, path: Path, contract: Contract | None = None,
                ) -> list[tuple[str, int, str]]:
    """(id, line, prompt as a person reads it) of every row of one of the set's data files."""
    contract = contract or load_contract(info)
    frame = _read_rows(path)
    out = []
    for number, row in enumerate(frame.to_dict("records"), start=1):
        if info.data_file is not None:
            text = userset.readable_prompt(info, row)
        else:
            text = "\n\n".join(str(row.get(field)) for field in contract.prompt)
        out.append((str(row.get(contract.id)), int(row.get(LINE, number)), text))
    return out


def prompts_by_id(info: EvalSetInfo) -> dict[str, str]:
    """Prompt text by item id, from the set's own data (results keep only a prompt hash)."""
    return {item: text for path in data_files(info) for item, _, text in prompt_rows(info, path)}


def generation_budget(spec: EvalSetSpec) -> int:
    """The most tokens an answer of the set may have (spec, else its task's max_gen_toks)."""
    return spec.max_gen_toks or int(
        (read_task_yaml(spec.info).get("generation_kwargs") or {}).get("max_gen_toks", 256))


def requests_in_flight(spec: EvalSetSpec, most: int, kv_cache_tokens: int | None) -> int:
    """How many of the set's requests to send at once: `most`, fewer where its prompts are long.

    The engine batches decoding: on 2 CPU cores the 135M demo model answered the math set at
    1.24 items/s through lm-eval with 4 requests in flight and at 7.16 with 64, 96 % of what the
    engine gives straight clients (python -m tools.benchmarks.harness). A set of long prompts
    (a length contract: long-context buckets) is bound by prefill instead, and requests beyond
    what the KV cache holds only queue in the engine, each waiting towards its timeout: such a
    set sends as many as the cache holds at its longest prompt and budget, at least one."""
    contract = load_contract(spec.info)
    if contract.lengths is None or kv_cache_tokens is None:
        return most
    bounds = contract.lengths.bounds
    longest = max(bounds[group][1] for group in spec.groups or bounds)
    per_request = longest + TEMPLATE_MARGIN_TOKENS + generation_budget(spec)
    return max(1, min(most, kv_cache_tokens // per_request))


def fit_to_context(sets: list[EvalSetSpec], max_model_len: int | None) -> list[EvalSetSpec]:
    """The sets with groups too long for the served context dropped (spec `groups`).

    A group fits when its longest prompt plus the chat template and the generation budget fits
    in `max_model_len`. Sets without length bounds are returned unchanged; a set none of whose
    groups fits raises SpecError.
    """
    if max_model_len is None:
        return list(sets)
    fitted = []
    for spec in sets:
        contract = load_contract(spec.info)
        check_groups(spec, contract)
        if contract.lengths is None:
            fitted.append(spec)
            continue
        budget = generation_budget(spec)
        bounds = contract.lengths.bounds
        wanted = spec.groups or sorted(bounds, key=lambda group: bounds[group][1])
        keep = [group for group in wanted
                if bounds[group][1] + TEMPLATE_MARGIN_TOKENS + budget
                <= max_model_len]
        if not keep:
            raise SpecError(f"eval set {spec.name!r}: no group fits max_model_len {max_model_len} "
                            f"(groups: {', '.join(wanted)})")
        fitted.append(spec if keep == wanted and spec.groups is None
                      else spec.model_copy(update={"groups": keep}))
    return fitted


def check_chat_template(sets: list[Any], chat_template: bool) -> None:
    """Refuse multi-turn sets without the chat template: a completions prompt has no turns, and
    flattening them would measure something else than the set claims."""
    if chat_template:
        return
    for spec in sets:
        if is_multiturn(read_task_yaml(spec.info)):
            raise SpecError(
                f"evalsets: {spec.name!r} is multi-turn (metadata.multiturn in "
                f"{spec.info.task_yaml}) and needs the chat template applied per turn, but the "
                "spec sets chat_template: false; set chat_template: true or drop the set")
