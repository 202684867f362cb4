"""The stage cache: a finished stage's results, keyed by everything that determines them.

A key is the sha256 of: the weights and config digest of the checkpoint, the engine (version and
exact command, the port left out), the eval sets (their data, task configs and the code that
scores them), the load profile, the hardware, and, for a stage after the baseline, the keys of
its parent and of the baseline (its divergence, flips and paired timing are against them) and
the part of the gate policy that decides what is measured (`measuring_policy`); for the
baseline, the budget of the scoring corpus it builds (`divergence.corpus_tokens`). Same key, same
measurement: a second candidate against the same baseline serves no baseline engine, a run
started again after a crash resumes after its last finished stage, and a stage that serves what
another stage served (a repair built as the bytes of a stage already measured, whatever either
is named: infra.digest.config_digest) takes that stage's measurement under its own name.

A control stage is never taken from the cache: re-measuring is its purpose. A structured_output
stage serves its parent's configuration; its kind and request options (response_format) are in
its key, so it never reads its parent's entry.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from pathlib import Path

from evalsets.lmeval_task import data_digest as lmeval_data_digest
from evalsets.userset import data_digest
from flows.plan import Stage, searches_capacity
from flows.spec import Spec
from infra.digest import checkpoint_digest, folder_digest, hardware
from load.profile import PromptSource
from load.prompts import source_digest

# Bump when a stored stage's layout or meaning changes: every older entry is then a miss.
CACHE_VERSION = 1
REPO = Path(__file__).resolve().parents[1]
# The code that produces a stage's numbers (and the built-in eval data beside it); the CLI, the
# service and the gates' judging are not in it: a verdict is recomputed from stored stages.
MEASURING = ("evalsets", "load", "infra/engine.py", "infra/launch.py", "infra/vllm_args.py",
             *sorted(f"infra/{path.name}" for path in (REPO / "infra").glob("*_engine.py")),
             "infra/probe.py", "infra/checkpoint.py", "infra/cores.py", "flows/adaptive.py",
             "flows/engines.py", "flows/tasks.py", "gates/accuracy.py", "gates/noninferiority.py",
             "gates/token_pairs.py")
MEASURING_SUFFIXES = (".py", ".yaml", ".yml", ".jsonl", ".json", ".txt", ".jinja")
KEY_FILE = "cache-key.json"


def engine_part(spec: Spec, stage: Stage) -> dict:
    """The engine's share of a stage's key, as its kind says (its command, version, URL)."""
    return spec.engine.cache_identity(stage.name, stage.engine_flags)


def stage_parts(stage: Stage, spec: Spec, profile: dict, policy: dict,
                keys: dict[str, str], code: str, in_flight: int) -> dict:
    parts = {
        "cache_version": CACHE_VERSION,
        "weights": checkpoint_digest(stage.checkpoint),
        "engine": engine_part(spec, stage),
        "evalsets": [s.model_dump(mode="json") for s in spec.evalsets],
        "chat_template": spec.chat_template,
        # Requests in flight change batched arithmetic, so greedy answers and logprobs with it.
        "in_flight": in_flight,
        "code": code,
        "load_profile": profile,
        # A prompt source's content, not only its name: an edited prompt file is a new load.
        "load_prompts": source_digest(PromptSource.model_validate(profile.get("prompts") or {})),
        "hardware": hardware(spec.engine.serving_device()),
    }
    user_data = {s.name: data_digest(s.path) for s in spec.evalsets if s.path is not None}
    user_data |= {s.name: lmeval_data_digest(s) for s in spec.evalsets if s.lm_eval is not None}
    if user_data:  # sets outside evalsets/ (not in `code`): by their content
        parts["evalset_data"] = user_data
    if stage.request_options:  # a structured_output stage: same serving, other requests
        parts |= {"kind": stage.kind, "request_options": stage.request_options}
    if stage.parent is not None:
        parts |= {"parent": keys[stage.parent], "baseline": keys["baseline"],
                  "policy": measuring_policy(policy)}
    else:  # the baseline builds the scoring corpus every later stage scores, within this budget
        parts["corpus_tokens"] = policy.get("divergence", {}).get("corpus_tokens")
    return parts


def measuring_policy(policy: dict) -> dict:
    """The gate policy's part that decides what a stage measures, so that re-judging with other
    limits needs no engine where nothing measured would change.

    The adaptive design measures while it judges, so most of the policy is in: the tolerances,
    `quality` and `length` decide how many items are scored (the looks grow until the rules
    resolve) and divergence, perplexity and length limits stop the looks once a rule fails for
    good; a required latency rule adds interleaved rounds while unresolved. Left out: the load
    error-rate limit (judged on what was measured), and an advisory latency rule's limits (its
    rounds are the profile's, whatever the limits; only `required` changes what is served)."""
    measuring = {name: part for name, part in policy.items() if name != "load"}
    latency = policy.get("latency")
    if isinstance(latency, dict) and not latency.get("required", False):
        measuring["latency"] = {"required": False}
    return measuring


def measuring_code() -> str:
    parts = [folder_digest(REPO / name, MEASURING_SUFFIXES) if (REPO / name).is_dir()
             else hashlib.sha256((REPO / name).read_bytes()).hexdigest() for name in MEASURING]
    return hashlib.sha256("".join(parts).encode()).hexdigest()


def stage_keys(stages: list[Stage], spec: Spec, profile: dict, policy: dict,
               in_flight: int) -> dict[str, dict]:
    """Each stage's key parts, in plan order (a parent's key goes into its children's);
    `in_flight`: the most eval requests in flight (Settings.num_concurrent)."""
    code = measuring_code()
    keys: dict[str, str] = {}
    parts: dict[str, dict] = {}
    for stage in stages:
        parts[stage.name] = stage_parts(stage, spec, profile, policy, keys, code, in_flight)
        # An emulated stage runs no load: where it stands in the plan changes nothing measured.
        parts[stage.name]["capacity_search"] = not stage.axes.emulated and searches_capacity(
            stage, stages, profile.get("capacity") or {})
        keys[stage.name] = digest(parts[stage.name])
    return parts


def digest(parts: dict) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


class StageCache:
    """Folders `<root>/<key>/`, each a finished stage's results folder as it was stored."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def lookup(self, key: str) -> Path | None:
        entry = self.root / key
        return entry if (entry / "stage.json").is_file() and (entry / KEY_FILE).is_file() else None

    def restore(self, key: str, folder: Path) -> bool:
        """Copy a cached stage into a run's folder; False on a miss."""
        entry = self.lookup(key)
        if entry is None:
            return False
        if folder.exists():
            shutil.rmtree(folder)
        shutil.copytree(entry, folder, symlinks=True)
        return True

    def store(self, key: str, parts: dict, folder: Path) -> None:
        """Put a finished stage's folder under its key, replacing an older copy atomically."""
        self.root.mkdir(parents=True, exist_ok=True)
        scratch = self.root / f".{key}.{uuid.uuid4().hex[:8]}"
        shutil.copytree(folder, scratch, symlinks=True)
        (scratch / KEY_FILE).write_text(json.dumps(parts, indent=1, sort_keys=True, default=str))
        entry = self.root / key
        old = None
        if entry.exists():
            old = self.root / f".{key}.old.{uuid.uuid4().hex[:8]}"
            os.replace(entry, old)
        os.replace(scratch, entry)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
