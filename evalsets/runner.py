"""Quality measurement: run the eval sets with lm-eval against an OpenAI-compatible server.

One lm-eval run per eval set (each set has its own item limit), then lm-eval's per-sample log
is turned into `QualityItem` rows paired across stages by the item's own `id` (an lm-eval task
named by `lm_eval`: by lm-eval's document identity, evalsets/lmeval_task.py).
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import logging
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, NamedTuple

import httpx

from evalsets.perplexity import measure_perplexity
from evalsets.results import (
    SAMPLES_FILE,
    QualityItem,
    QualityResult,
    TaskQuality,
    sample_folder,
)
from evalsets.sampling import combined, request_kwargs
from evalsets.spec import EvalSetSpec
from evalsets.structured import check_guided_decoding, structured_formats
from infra.errors import MeasurementError, SpecError
from infra.progress import progress
from infra.secrets import auth_headers

log = logging.getLogger(__name__)

INSTALL_HINT = "lm-eval is missing: pip install 'lm-eval[api]'"
RESULTS_FILE = "lm_eval_results.json"


def prompt_hash(prompt: str) -> str:
    return hashlib.sha256(prompt.encode()).hexdigest()[:16]


def load_task_config(spec: EvalSetSpec) -> dict[str, Any]:
    """The set's task.yaml as an lm-eval config dict, data paths absolute, overrides applied; a
    user data file's config is built in memory around its scorer (evalsets.userset); a named
    lm-eval task's is lm-eval's own (evalsets.lmeval_task). A sampled set's generation settings
    include its sampling (evalsets.sampling), `samples` among them, as the stages compare them."""
    config = _task_config(spec)
    if spec.sampling is not None:
        config.setdefault("generation_kwargs", {}).update(spec.sampling.generation_kwargs())
    return config


def _task_config(spec: EvalSetSpec) -> dict[str, Any]:
    if spec.lm_eval is not None:
        from evalsets.lmeval_task import task_config

        return task_config(spec)
    try:
        from lm_eval.tasks._yaml_loader import load_yaml  # resolves `!function` next to the yaml
    except ImportError as exc:
        raise MeasurementError(INSTALL_HINT) from exc
    info = spec.info
    if info.data_file is not None:
        from evalsets.userset import task_config

        config = task_config(info)
    else:
        config = load_yaml(info.task_yaml, resolve_func=True)
    data_files = config.get("dataset_kwargs", {}).get("data_files")
    if isinstance(data_files, dict):
        config["dataset_kwargs"]["data_files"] = {
            split: str((info.folder / path).resolve()) for split, path in data_files.items()
        }
    elif isinstance(data_files, str):
        config["dataset_kwargs"]["data_files"] = str((info.folder / data_files).resolve())
    if spec.max_gen_toks is not None:
        config.setdefault("generation_kwargs", {})["max_gen_toks"] = spec.max_gen_toks
    if spec.groups is not None:
        config["process_docs"] = _only_groups(group_field(spec), spec.groups, spec.name)
    return config


def group_field(spec: EvalSetSpec) -> str | None:
    """The doc field that names an item's sub-group (e.g. 'bucket'), from the set's contract."""
    from evalsets.contracts import load_contract

    return load_contract(spec.info).group


def cluster_field(spec: EvalSetSpec) -> str | None:
    """The doc field that names an item's cluster of near-duplicates, from the set's contract."""
    from evalsets.contracts import load_contract

    return load_contract(spec.info).cluster


def _only_groups(field: str | None, groups: list[str], name: str) -> Callable[[Any], Any]:
    if field is None:
        raise MeasurementError(f"eval set {name!r} declares no group field; cannot select groups")
    wanted = set(groups)

    def process_docs(dataset: Any) -> Any:
        return dataset.filter(lambda doc: str(doc[field]) in wanted)

    return process_docs


def _slice(process_docs: Callable[[Any], Any] | None, start: int,
           stop: int | None, split: str | None = None) -> Callable[[Any], Any]:
    """Docs [start, stop) of the set (after any group filter): a later batch of items. lm-eval
    also runs `process_docs` on the few-shot split; with `split` (the split evaluated) another
    split keeps every doc, so the few-shot examples stay those of the first look."""

    def sliced(dataset: Any) -> Any:
        docs = process_docs(dataset) if process_docs else dataset
        named = getattr(dataset, "split", None)
        if split is not None and named is not None and str(named) != split:
            return docs
        end = len(docs) if stop is None else min(stop, len(docs))
        return docs.select(range(min(start, end), end))

    return sliced


def primary_metric(config: dict[str, Any]) -> str:
    metadata = config.get("metadata") or {}
    if "primary_metric" in metadata:
        return metadata["primary_metric"]
    return config["metric_list"][0]["metric"]


def _response(sample: dict[str, Any]) -> str:
    filtered = sample.get("filtered_resps") or sample.get("resps") or [""]
    first = filtered[0]
    while isinstance(first, list | tuple):  # raw resps are nested one level deeper
        first = first[0] if first else ""
    return str(first)


def _prompt(sample: dict[str, Any]) -> str:
    arguments = sample.get("arguments")
    # In memory [(context, gen_kwargs), ...]; in lm-eval's files {"gen_args_0": {"arg_0": ..}}.
    if isinstance(arguments, dict):
        return str(next(iter(arguments.values()))["arg_0"])
    return str(arguments[0][0])


class ServerFinish(NamedTuple):
    """What the server said about one generation (lm-eval itself keeps only the text)."""

    finish_reason: str | None
    completion_tokens: int | None


def samples_to_items(
    samples: Iterable[dict[str, Any]],
    metric: str,
    max_gen_toks: int,
    count_tokens: Callable[[str], int] | None = None,
    server_finish: dict[str, ServerFinish] | None = None,
    group_field: str | None = None,
    cluster_field: str | None = None,
    traces: dict[str, str] | None = None,
) -> list[QualityItem]:
    """lm-eval's logged samples as QualityItems, in doc order; ids must be present and unique.

    Output tokens and finish reason come from the server when it reported them for that exact
    response text; otherwise tokens are counted with `count_tokens` and a response that used the
    whole budget counts as cut off ('length'). `group_field` names the doc field copied into
    `QualityItem.group` (a long-context bucket, say), `cluster_field` the one copied into
    `QualityItem.cluster` (a template, say). `traces` maps an answer to the reasoning trace split
    off it: counted as `reasoning_tokens`, out of the answer's `output_tokens`.
    """
    items = []
    for sample in sorted(samples, key=lambda s: s["doc_id"]):
        doc = sample["doc"]
        if "id" not in doc:
            raise MeasurementError(
                f"eval item {sample['doc_id']} has no 'id' field (items pair across stages by id)"
            )
        if metric not in sample:
            raise MeasurementError(
                f"sample has no metric {metric!r} (has: {sorted(sample.get('metrics', []))})"
            )
        response = _response(sample)
        reported = (server_finish or {}).get(response, ServerFinish(None, None))
        tokens = reported.completion_tokens
        trace = (traces or {}).get(response)
        thinking = count_tokens(trace) if trace is not None and count_tokens is not None else None
        if tokens is not None and thinking is not None:
            tokens = max(0, tokens - thinking)  # the server counts the trace and the answer
        elif tokens is None and count_tokens is not None:
            tokens = count_tokens(response)
        finish = reported.finish_reason
        if finish is None and tokens is not None:
            finish = "length" if tokens >= max_gen_toks else "stop"
        items.append(
            QualityItem(
                id=str(doc["id"]),
                prompt_hash=prompt_hash(_prompt(sample)),
                response=response,
                score=float(sample[metric]),
                output_tokens=tokens,
                finish_reason=finish,
                group=str(doc[group_field]) if group_field and doc.get(group_field) is not None
                else None,
                cluster=str(doc[cluster_field])
                if cluster_field and doc.get(cluster_field) is not None else None,
                reasoning_tokens=thinking,
            )
        )
    ids = [item.id for item in items]
    if len(set(ids)) != len(ids):
        duplicated = sorted({i for i in ids if ids.count(i) > 1})
        raise MeasurementError(f"eval item ids are not unique: {duplicated[:5]}")
    return items


def token_counter(tokenizer_dir: Path) -> Callable[[str], int]:
    """Counts tokens of a response with the model's own tokenizer, from local files only."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
    except (OSError, ValueError) as exc:
        raise MeasurementError(f"cannot load a tokenizer from {tokenizer_dir}: {exc}") from exc
    return lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"])


def check_server(base_url: str, model: str) -> None:
    """Fail fast, in one line, when the server is down or serves another model."""
    url = f"{base_url.rstrip('/')}/v1/models"
    try:
        response = httpx.get(url, timeout=10, headers=auth_headers())
        response.raise_for_status()
        served = [entry["id"] for entry in response.json().get("data", [])]
    except (httpx.HTTPError, ValueError, KeyError) as exc:
        raise MeasurementError(f"quality: server at {url} is not answering: {exc!r}") from exc
    if model not in served:
        raise MeasurementError(
            f"quality: model {model!r} is not served at {base_url} (serves: {served})"
        )


def recording_model(apply_chat_template: bool, on_items: Callable[[int], None] | None = None,
                    response_formats: dict[str, dict] | None = None,
                    reasoning_end: str | None = None, **model_args: Any) -> Any:
    """lm-eval's local (chat-)completions model that also keeps each response's finish reason
    and completion tokens from the server, keyed by the response text (`.server_finish`), and
    the reasoning trace split off before scoring (`.traces`): the one an engine's reasoning
    parser returned apart, or the text up to `reasoning_end`. A reply cut at the budget before
    its trace closed has no answer at all.

    Chat requests carry an encoded dialogue (evalsets/multiturn.py) as its separate messages, so
    the server applies the chat template per turn. `response_formats` maps a prompt (the text
    `doc_to_text` gave) to the `response_format` its request carries (guided decoding)."""
    from lm_eval.models.openai_completions import LocalChatCompletion, LocalCompletionsAPI

    from evalsets.multiturn import decode_dialogue, expand_messages

    base = LocalChatCompletion if apply_chat_template else LocalCompletionsAPI
    formats = response_formats or {}

    class Recording(base):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.server_finish: dict[str, ServerFinish] = {}
            self.traces: dict[str, str] = {}

        def _create_payload(self, messages: Any, *args: Any, **kwargs: Any) -> dict:
            if apply_chat_template:
                prompt = next((m.get("content") for m in reversed(messages)
                               if m.get("role") == "user"), None)
                messages = expand_messages(messages)
            else:
                prompt = messages if isinstance(messages, str) else None
                if decode_dialogue(prompt) is not None:
                    raise MeasurementError("a multi-turn item reached the completions endpoint; "
                                           "multi-turn sets need chat_template: true")
            payload = super()._create_payload(messages, *args, **kwargs)
            if prompt in formats:
                payload["response_format"] = formats[prompt]
            return payload

        def parse_generations(self, outputs: dict | list[dict], **kwargs: Any) -> list[str]:
            texts = super().parse_generations(outputs, **kwargs)
            choices, usages = [], []
            for out in outputs if isinstance(outputs, list) else [outputs]:
                out_choices = sorted(out.get("choices", []), key=lambda c: c.get("index", 0))
                tokens = (out.get("usage") or {}).get("completion_tokens")
                choices += out_choices
                # usage is per request: it is one response's count only when there is one choice
                usages += [tokens if len(out_choices) == 1 else None] * len(out_choices)
            answers = []
            for text, choice, tokens in zip(texts, choices, usages, strict=False):
                if text is not None:
                    text, trace = split_trace(text, choice, reasoning_end)
                    self.server_finish[text] = ServerFinish(choice.get("finish_reason"), tokens)
                    if trace is not None:
                        self.traces[text] = trace
                answers.append(text)
            if on_items is not None:
                on_items(len(texts))
            return answers

    return Recording(**model_args)


def split_trace(text: str, choice: dict[str, Any], reasoning_end: str | None,
                ) -> tuple[str, str | None]:
    """(answer, reasoning trace or None) of one reply. vLLM's reasoning parsers return the trace
    as `reasoning_content` (`reasoning` in later releases); otherwise the declared delimiter
    splits it, and a reply cut at the budget without it is all trace."""
    message = choice.get("message") or {}
    parsed = message.get("reasoning_content") or message.get("reasoning")
    if isinstance(parsed, str):
        return text, parsed
    if reasoning_end is None:
        return text, None
    trace, found, answer = text.partition(reasoning_end)
    if found:
        return answer.lstrip(), trace
    if choice.get("finish_reason") == "length":
        return "", text
    return text, ""


def _save_raw(results: dict[str, Any], folder: Path) -> None:
    from lm_eval.utils import handle_non_serializable

    folder.mkdir(parents=True, exist_ok=True)
    samples = results.get("samples", {})
    summary = {key: value for key, value in results.items() if key != "samples"}
    (folder / RESULTS_FILE).write_text(
        json.dumps(summary, indent=1, default=handle_non_serializable)
    )
    with (folder / SAMPLES_FILE).open("w") as out:
        for task_samples in samples.values():
            for sample in task_samples:
                out.write(json.dumps(sample, default=handle_non_serializable) + "\n")


def run_evalset(
    base_url: str,
    model: str,
    spec: EvalSetSpec,
    out_dir: Path,
    count_tokens: Callable[[str], int] | None,
    apply_chat_template: bool = True,
    num_concurrent: int = 4,
    timeout_s: int = 300,
    start: int = 0,
    on_items: Callable[[int], None] | None = None,
    structured_output: bool = False,
    tokenizer_dir: Path | None = None,
) -> TaskQuality:
    """One eval set through lm-eval; raw results in `out_dir/<set>/`.

    With `start`, items [start, start + limit) of the set: a later batch of the adaptive
    sample size (raw results then in `out_dir/<set>-from<start>/`). With `structured_output`,
    every item that declares a JSON Schema is asked for with it as `response_format` (the
    engine's guided decoding); the others are asked as usual. A log-likelihood set (a user
    `choice` set) needs `tokenizer_dir`: lm-eval then tokenizes with the model's own tokenizer.
    A sampled set runs once per sample (raw results in `<set>-s<j>/`), combined per item."""
    try:
        import lm_eval.tasks  # noqa: F401 - the install hint before anything else
    except ImportError as exc:
        raise MeasurementError(INSTALL_HINT) from exc

    config = load_task_config(spec)
    limit = spec.limit
    if start:
        stop = None if spec.limit is None else start + spec.limit
        evaluated = config.get("test_split") or config.get("validation_split")
        config["process_docs"] = _slice(config.get("process_docs"), start, stop, evaluated)
        limit = None
    metric = primary_metric(config)
    max_gen_toks = int(config.get("generation_kwargs", {}).get("max_gen_toks", 256))
    root = base_url.rstrip("/")
    # Chat: the server applies the model's own chat template, so no tokenizer is needed here.
    endpoint = "/v1/chat/completions" if apply_chat_template else "/v1/completions"
    tokenizing = {"tokenizer_backend": None, "tokenized_requests": False}
    if tokenizer_dir is not None:
        from evalsets.userset import loglikelihood_model_args

        tokenizing |= loglikelihood_model_args(config, tokenizer_dir)
    from evalsets import lmeval_task

    folder = out_dir / (f"{spec.name}-from{start}" if start else spec.name)
    # A sampled set: k runs, sample j of every item with seed + j (evalsets.sampling).
    seeds: list[int | None] = spec.sampling.seeds() if spec.sampling else [None]
    runs = []
    for index, seed in enumerate(seeds):
        asked = copy.deepcopy(config)
        if seed is not None:
            asked["generation_kwargs"] = request_kwargs(config["generation_kwargs"], seed)
        lm = recording_model(
            apply_chat_template,
            on_items,
            structured_formats(config, spec.info) if structured_output else None,
            spec.reasoning_end,
            model=model,
            base_url=root + endpoint,
            num_concurrent=num_concurrent,
            max_retries=3,
            timeout=timeout_s,
            **tokenizing,
        )
        # A named lm-eval task reads its data from the local cache or folder only, never the Hub.
        with lmeval_task.offline() if spec.lm_eval else contextlib.nullcontext():
            results = _evaluate(lm, asked, spec, root, limit, apply_chat_template)
        samples = results["samples"][config["task"]]
        if spec.lm_eval is not None:  # one filter's samples, each named by lm-eval's doc identity
            samples = lmeval_task.identified(samples, lmeval_task.chosen_filter(spec, config),
                                             start)
            results["samples"][config["task"]] = samples  # as the scoring corpus reads them
        _save_raw(results, folder if seed is None else sample_folder(folder, index))
        items = samples_to_items(
            samples, metric, max_gen_toks, count_tokens, lm.server_finish,
            group_field(spec), cluster_field(spec), lm.traces,
        )
        if not items:
            raise MeasurementError(f"quality: eval set {spec.name!r} produced no items")
        runs.append(TaskQuality(task=spec.name, metric=metric, items=items,
                                value=sum(item.score for item in items) / len(items)))
    return runs[0] if len(runs) == 1 else combined(runs)


def _evaluate(lm: Any, config: dict[str, Any], spec: EvalSetSpec, root: str,
              limit: int | None, apply_chat_template: bool) -> dict[str, Any]:
    """One pass of lm-eval over the set; its results, the set's samples among them."""
    import lm_eval
    import lm_eval.evaluator
    from lm_eval.tasks import TaskManager

    # lm-eval asks `git describe` for the working folder's commit, and outside a repository git
    # prints "fatal: not a git repository" on our stderr: the records keep quantgate's own code
    # digest (the stage cache key), so lm-eval's guess is not asked for.
    asked_git = lm_eval.evaluator.get_git_commit_hash
    lm_eval.evaluator.get_git_commit_hash = lambda: None
    try:
        results = lm_eval.simple_evaluate(
            model=lm,
            tasks=[copy.deepcopy(config)],
            task_manager=TaskManager(include_defaults=False),
            apply_chat_template=apply_chat_template,
            limit=limit,
            log_samples=True,
            bootstrap_iters=0,
        )
    except MeasurementError:
        raise
    except Exception as exc:  # lm-eval raises anything from HTTP errors to KeyErrors
        message = str(exc).splitlines()[0] if str(exc) else ""
        raise MeasurementError(
            f"quality: lm-eval task {spec.name!r} failed against {root}: "
            f"{type(exc).__name__}: {message}"
        ) from exc
    finally:
        lm_eval.evaluator.get_git_commit_hash = asked_git
    if not results or config["task"] not in results.get("samples", {}):
        raise MeasurementError(f"quality: lm-eval returned no samples for {spec.name!r}")
    return results


def prepare_corpus(out_dir: Path, corpus_from: Path | None, tokenizer_dir: Path,
                   set_names: list[str], apply_chat_template: bool,
                   max_model_len: int | None = None, corpus_tokens: int | None = None) -> None:
    """The baseline builds the scoring corpus from its answers (at most `corpus_tokens` scored
    tokens); a later stage copies it. Without one (no tokenizer, an older baseline) the prose
    texts are scored as text, as before."""
    from evalsets.token_corpus import MAX_SEQUENCE_TOKENS, ScoringCorpus, build_corpus

    longest = min(MAX_SEQUENCE_TOKENS, max_model_len - 1 if max_model_len else MAX_SEQUENCE_TOKENS)
    try:
        corpus = (build_corpus(out_dir, set_names, tokenizer_dir, apply_chat_template,
                               max_sequence_tokens=longest, max_tokens=corpus_tokens)
                  if corpus_from is None else ScoringCorpus.read(corpus_from))
    except MeasurementError as err:
        log.error("quality: no scoring corpus from the answers, prose only: %s", err)
        return
    if corpus is not None:
        corpus.save(out_dir)


def run_quality(
    base_url: str,
    model: str,
    sets: list[EvalSetSpec],
    out_dir: Path,
    tokenizer_dir: Path,
    apply_chat_template: bool = True,
    num_concurrent: int = 64,
    with_perplexity: bool = True,
    max_model_len: int | None = None,
    kv_cache_tokens: int | None = None,
    corpus_from: Path | None = None,
    structured_output: bool = False,
    corpus_tokens: int | None = None,
) -> QualityResult:
    """Every eval set, then (optionally) corpus perplexity; results also saved under `out_dir`.

    `num_concurrent`: the most requests in flight; a set of long prompts sends as many as the
    engine's `kv_cache_tokens` hold (evalsets.contracts.requests_in_flight).

    `structured_output`: items that declare a JSON Schema are asked for with it as
    `response_format` (a structured_output stage's guided decoding; see run_evalset).

    With `max_model_len` (the served context), groups whose prompts cannot fit are left out
    (long-context buckets beyond the engine's context), logged, never silently truncated.
    Perplexity scores the scoring corpus (evalsets.token_corpus): the baseline builds it from
    its own answers, within `corpus_tokens` scored tokens (the gate policy's budget); later stages
    score a copy of it from `corpus_from` (the baseline's quality folder), keeping their own
    per-position logprobs. This measures one stage: pairing them with
    the baseline's and the parent's happens after, from the stored files (gates.token_pairs).
    """
    from evalsets.contracts import fit_to_context, requests_in_flight

    check_server(base_url, model)
    if structured_output:
        check_guided_decoding(base_url, model, apply_chat_template)
    try:
        fitted = fit_to_context(sets, max_model_len)
    except SpecError as err:
        raise MeasurementError(f"quality: {err}") from err
    for before, after in zip(sets, fitted, strict=True):
        if after.groups != before.groups:
            log.warning("quality: %s limited to groups %s by max_model_len %s",
                        after.name, ", ".join(after.groups or []), max_model_len)
    sets = fitted
    count_tokens = token_counter(tokenizer_dir)
    result = QualityResult()
    for spec in sets:
        started = time.monotonic()
        total = spec.limit * (spec.sampling.samples if spec.sampling else 1) if spec.limit else None
        with progress.task(f"{out_dir.parent.name}: {spec.name}", total) as advance:
            task = run_evalset(base_url, model, spec, out_dir, count_tokens, apply_chat_template,
                               requests_in_flight(spec, num_concurrent, kv_cache_tokens),
                               on_items=advance,
                               structured_output=structured_output,
                               tokenizer_dir=tokenizer_dir)
        task.seconds = round(time.monotonic() - started, 2)
        result.tasks[spec.name] = task
    started = time.monotonic()
    if with_perplexity:
        # A choice set's logged "response" is a log-likelihood, not text to score.
        generated = [s.name for s in sets if getattr(s.scorer, "kind", None) != "choice"]
        prepare_corpus(out_dir, corpus_from, tokenizer_dir, generated, apply_chat_template,
                       max_model_len, corpus_tokens)
        result.perplexity = measure_perplexity(base_url, model, out_dir).perplexity
        result.scoring_s = round(time.monotonic() - started, 2)
    result.save(out_dir)
    return result
