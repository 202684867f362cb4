"""The MLflow Model Registry side of the service: candidate intake, checkpoints, the A/B aliases."""

from __future__ import annotations

import getpass
import hashlib
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse

import yaml
from pydantic import BaseModel, Field, computed_field

from infra.checkpoint import check_checkpoint, read_config
from infra.errors import CheckpointError, QuantgateError, SpecError, did_you_mean
from infra.paths import follow, links_out_of, shown
from infra.yamlfile import read_yaml

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities.model_registry import ModelVersion

log = logging.getLogger(__name__)

STATUS = "quantgate.status"
SPEC = "quantgate.spec"
STAGE = "quantgate.stage"
ALIAS_LOG = "quantgate.alias_log"
HANDLED = ("queued", "running", "go", "rollback", "error")
MARKS = ("queued", "running", "error")
CHAMPION, PREVIOUS = "champion", "previous"
CHECKPOINT_EXPERIMENT = "quantgate-checkpoints"
# mlflow.utils.validation.MAX_MODEL_REGISTRY_TAG_VALUE_LENGTH; a registered model's tag is narrower:
# its SQL column is String(5000) (mlflow/store/model_registry/dbmodels/models.py).
VERSION_TAG_LIMIT = 100_000
MODEL_TAG_LIMIT = 5_000


class RegistryError(QuantgateError):
    """The registry lacks what was asked for, or refused a change."""


class Candidate(BaseModel):
    """A new registered-model version to accept: where its checkpoint is and which spec judges it."""

    model: str
    version: str
    source: str = Field(description="The version's source: the checkpoint folder or its URI.")
    spec: Path = Field(description="The spec template (tag quantgate.spec).")
    stage: str | None = Field(default=None, description="Stage it replaces; default: the last.")
    tracking_uri: str = Field(description="The MLflow server or store the version lives in.")

    @computed_field
    @property
    def key(self) -> str:
        """The Prefect idempotency key: one acceptance run per version."""
        return f"{self.model}@{self.version}"


# --- intake -------------------------------------------------------------------------------------

def poll(client: MlflowClient, watched: list[str], seen: set[str]) -> list[Candidate]:
    """New versions of the watched models, oldest first, each once.

    Skips versions whose key is in `seen` (this adds every key it looks at) and versions already
    tagged quantgate.status, so a restarted poller resubmits nothing.
    """
    found = []
    for model in watched:
        check_model_name(model)
        for version in sorted(_versions(client, model), key=lambda v: int(v.version)):
            candidate = admit(client, version, seen)
            if candidate is not None:
                found.append(candidate)
    return found


def intake(client: MlflowClient, model: str, version: str, seen: set[str]) -> Candidate | None:
    """The one version a webhook announced, through the same checks as `poll`."""
    return admit(client, client.get_model_version(model, version), seen)


def admit(client: MlflowClient, version: ModelVersion, seen: set[str]) -> Candidate | None:
    """A Candidate, or None when it was handled already or is rejected (tagged error, with why)."""
    key = f"{version.name}@{version.version}"
    handled = key in seen or version.tags.get(STATUS) in HANDLED
    seen.add(key)
    if handled:
        return None
    spec = version.tags.get(SPEC) or client.get_registered_model(version.name).tags.get(SPEC)
    if not spec:
        reason = (f"no spec template: tag {SPEC} with a spec path on the version or on the "
                  f"registered model {version.name!r}")
    elif not Path(spec).expanduser().is_file():
        reason = f"spec template {spec!r} (tag {SPEC}) is not a file here"
    else:
        source = version.source
        if source.startswith("models:"):  # MLflow resolves these via the process-wide registry
            source = client.get_model_version_download_uri(version.name, version.version)
        return Candidate(model=version.name, version=str(version.version), source=source,
                         spec=Path(spec).expanduser().resolve(), stage=version.tags.get(STAGE),
                         tracking_uri=client.tracking_uri)
    log.warning("rejected %s: %s", key, reason)
    _tag(client, version.name, str(version.version), {STATUS: "error", "quantgate.error": reason})
    return None


def mark(client: MlflowClient, candidate: Candidate, status: str, **tags: object) -> None:
    """Tag the version's progress (queued, running, error); extra tags become quantgate.<name>."""
    if status not in MARKS:
        raise RegistryError(f"unknown status {status!r}: {did_you_mean(status, MARKS)}")
    values = {STATUS: status} | {f"quantgate.{name}": str(value) for name, value in tags.items()}
    _tag(client, candidate.model, candidate.version, values)


def _versions(client: MlflowClient, model: str) -> Iterator[ModelVersion]:
    token = None
    while True:
        page = client.search_model_versions(_name_filter(model), page_token=token)
        yield from page
        token = page.token
        if not token:
            return


def _tag(client: MlflowClient, model: str, version: str, tags: dict[str, str]) -> None:
    for key, value in tags.items():
        client.set_model_version_tag(model, version, key, value[:VERSION_TAG_LIMIT])


# --- the spec for one candidate -------------------------------------------------------------------

def materialize(candidate: Candidate, out_dir: Path, cache_dir: Path | None = None) -> Path:
    """Write the candidate's spec: the template with its checkpoint in the chosen stage.

    Paths the template gives relative to its folder become absolute, with the meaning the loaders
    give them (flows/spec.py checkpoints, flows/preflight.py load_profile, gates/policy.py policy).
    """
    template = candidate.spec.resolve()
    data = read_yaml(template)
    stages = data.get("stages") if isinstance(data, dict) else None
    if not isinstance(stages, list) or not stages or not all(isinstance(s, dict) for s in stages):
        raise SpecError(f"{template}: no stages to put {candidate.key}'s checkpoint in")
    names = [str(stage.get("name")) for stage in stages]
    name = candidate.stage or names[-1]
    if name not in names:
        raise SpecError(f"{template}: {candidate.key} asks for stage {name!r} (tag {STAGE}), "
                        f"which the template lacks; {did_you_mean(name, names)}")
    stage = stages[names.index(name)]
    if stage.get("kind") == "control":
        raise SpecError(f"{template}: stage {name!r} is a control; it takes no checkpoint")

    base = template.parent
    baseline = data.get("baseline")
    if isinstance(baseline, dict) and baseline.get("checkpoint"):
        baseline["checkpoint"] = _absolute(baseline["checkpoint"], base)
    for each in stages:
        if each.get("checkpoint"):
            each["checkpoint"] = _absolute(each["checkpoint"], base)
    profile = data.get("load_profile")
    if isinstance(profile, str) and profile.endswith((".yaml", ".yml")):
        data["load_profile"] = _absolute(profile, base)
    policy = data.get("gate_policy")
    if isinstance(policy, str) and policy != "default":
        data["gate_policy"] = _absolute(policy, base)

    out_dir = Path(out_dir)
    cache = cache_dir or out_dir / "checkpoints"
    stage["checkpoint"] = str(checkpoint_path(candidate.source, candidate.tracking_uri, cache))
    data["candidate"] = candidate_name(candidate.model, candidate.version)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{data['candidate']}.yaml"
    header = f"# {candidate.key} from {template} (source {candidate.source})\n"
    path.write_text(header + yaml.safe_dump(data, sort_keys=False))
    from flows.spec import load_spec

    load_spec(path)  # a template that cannot be run fails here, at intake, naming the file
    return path


def candidate_name(model: str, version: str) -> str:
    """`<model>-v<version>`, made to fit the spec's candidate-name pattern."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", f"{model}-v{version}").lstrip("._-")
    return name or f"v{version}"


def _absolute(value: object, base: Path) -> str:
    path = Path(str(value))
    return str(path if path.is_absolute() else (base / path).resolve())


# --- checkpoints as version sources ---------------------------------------------------------------

# registered_models.name is a String(256) column (mlflow/store/model_registry/dbmodels/models.py).
MODEL_NAME_LIMIT = 256


def check_model_name(model: str) -> None:
    """Refuse, before any store is opened, a registered-model name MLflow would refuse, or one
    that a store or the registry's search filter cannot hold (quantgate polls `name='...'`)."""
    from mlflow.exceptions import MlflowException
    from mlflow.utils.validation import _validate_model_name  # the registry's own rule

    from flows.tracking import mlflow_message

    plain = re.sub(r"[/:'\"\x00-\x1f\x7f]+", "-", model).strip(" .-")[:64] or "my-model"
    try:
        _validate_model_name(model)
    except MlflowException as err:
        raise RegistryError(f"model name {model!r}: MLflow refuses it "
                            f"({shown(mlflow_message(err))}); choose a non-empty name without "
                            f"'/' or ':', such as {plain!r}") from err
    problem = None
    if re.search(r"[\x00-\x1f\x7f]", model):
        problem = "holds a control character (a NUL byte, a line break), which a store cannot hold"
    elif len(model) > MODEL_NAME_LIMIT:
        problem = f"is {len(model)} characters long, more than MLflow's {MODEL_NAME_LIMIT}"
    elif model != model.strip():
        problem = "starts or ends with a space, which no one types back"
    elif "'" in model and '"' in model:
        problem = "holds both quote marks, which the registry's search filter cannot quote"
    if problem:
        raise RegistryError(f"model name {model[:80]!r} {problem}; choose another name, "
                            f"such as {plain!r}")


def _name_filter(model: str) -> str:
    """The search filter of one registered model (quoted with the mark the name lacks)."""
    quote = '"' if "'" in model else "'"
    return f"name={quote}{model}{quote}"


# huggingface_hub's cache: <cache>/models--<org>--<name>/snapshots/<revision>/, whose files are
# symlinks into <cache>/models--<org>--<name>/blobs/.
HF_SNAPSHOT = re.compile(r"(^|/)models--[^/]+/snapshots/[^/]+/?$")


def check_source(checkpoint: Path) -> Path:
    """A checkpoint folder that may become a version's source, resolved: a model an engine can
    serve (infra.checkpoint.check_checkpoint), holding its own files. A registered version gets
    the folder's files (hard links, a copy, an upload), and a symlink is followed on the way: a
    file linked in from outside the folder would be published with it, and a Hugging Face cache
    snapshot is links into a cache that prunes and replaces revisions."""
    try:
        read_config(checkpoint)  # NUL bytes, loops, not a model: one line each
    except CheckpointError as err:
        raise CheckpointError(f"{err}; give register the folder of a checkpoint (its "
                              "config.json and weight files)") from err
    folder = checkpoint.resolve()
    outside = links_out_of(folder)
    if outside and HF_SNAPSHOT.search(str(folder)):
        raise CheckpointError(f"checkpoint {folder} is a Hugging Face cache snapshot (its files "
                              "are links into the cache's blobs); copy it out first, e.g. `hf "
                              f"download REPO --revision {folder.name} --local-dir DIR` or `cp "
                              f"-rL {folder} DIR`, and register DIR")
    if outside:
        link, target = outside[0]
        more = f" (and {len(outside) - 1} more)" if len(outside) > 1 else ""
        if target is None:
            raise CheckpointError(f"checkpoint {folder}: {link.relative_to(folder)} is a symlink "
                                  f"that leads to no file (its target is gone, or a loop){more}; "
                                  "remove it, or copy the file it meant into the folder")
        raise CheckpointError(f"checkpoint {folder}: {link.relative_to(folder)} is a symlink to "
                              f"{target}, outside the checkpoint folder{more}; registering it "
                              "would publish what it points at: copy the file into the folder "
                              f"(`cp -rL {folder} DIR`, then register DIR)")
    check_checkpoint(folder)  # what the engine reads: the service would fail it at intake
    return folder


def check_template(template: Path, stage: str | None, checkpoint: Path, model: str) -> Path:
    """The spec template a version is registered with, resolved, once it takes `checkpoint` in
    `stage` (default: its last) and loads: a template that cannot would be the version's error
    at intake, after it was registered."""
    found, problem = follow(template)
    if problem or found is None:
        raise SpecError(f"spec template {shown(template)} {problem or 'does not exist'}; pass "
                        "--spec a spec file (e.g. flows/specs/demo.yaml)")
    if not found.is_file():
        raise SpecError(f"spec template {template} is not a file; pass --spec a spec file "
                        "(e.g. flows/specs/demo.yaml)")
    trial = Candidate(model=model, version="new", source=str(checkpoint), spec=found,
                      stage=stage, tracking_uri="")
    with tempfile.TemporaryDirectory(prefix="quantgate-register-") as scratch:
        materialize(trial, Path(scratch))
    return found


def registration_tags(model: str, checkpoint: Path, spec: Path | None,
                      stage: str | None) -> dict[str, str]:
    """What `quantgate register` refuses before any store is opened (the name, the checkpoint,
    the spec template and its stage), and the version tags it then registers with."""
    check_model_name(model)
    folder = check_source(checkpoint)
    tags = {}
    if spec is not None:
        tags[SPEC] = str(check_template(spec, stage, folder, model))
    if stage is not None:
        tags[STAGE] = stage
    return tags


def register_checkpoint(client: MlflowClient, model: str, checkpoint: Path,
                        tags: dict[str, str] | None = None,
                        experiment: str = CHECKPOINT_EXPERIMENT) -> ModelVersion:
    """Register a checkpoint folder as a new version of `model`, copying nothing where possible.

    An MLflow server takes a local source only inside the artifact folder of the run given as
    run_id, and resolves symlinks before it checks (mlflow/server/handlers.py
    `_validate_source_run`): a symlink to the folder is refused. So a local artifact store gets
    the folder as hard links (no bytes copied; a copy across file systems); a proxied or remote
    one (mlflow-artifacts:, s3:) gets an upload.
    """
    from mlflow.exceptions import MlflowException

    from flows.tracking import mlflow_message

    check_model_name(model)
    checkpoint = check_source(Path(checkpoint))
    try:
        return _register(client, model, checkpoint, tags, experiment)
    except MlflowException as err:  # the store refused it: a name, a tag, a source
        raise RegistryError(f"registering {checkpoint} as a version of {model!r} at "
                            f"{client.tracking_uri}: {mlflow_message(err)}") from err


def _register(client: MlflowClient, model: str, checkpoint: Path, tags: dict[str, str] | None,
              experiment: str) -> ModelVersion:
    from mlflow.utils.file_utils import local_file_uri_to_path

    _ensure_model(client, model)
    found = client.get_experiment_by_name(experiment)
    experiment_id = found.experiment_id if found else client.create_experiment(experiment)
    run = client.create_run(experiment_id, run_name=f"{model} checkpoint",
                            tags={"quantgate.checkpoint": str(checkpoint)})
    run_id, artifacts = run.info.run_id, run.info.artifact_uri
    if urlparse(artifacts).scheme in ("", "file"):
        placed = _link_tree(checkpoint, Path(local_file_uri_to_path(artifacts)) / "checkpoint")
    else:
        client.log_artifacts(run_id, str(checkpoint), "checkpoint")
        placed = "uploaded"
    client.set_tag(run_id, "quantgate.placement", placed)
    client.set_terminated(run_id)
    return client.create_model_version(model, f"{artifacts}/checkpoint", run_id=run_id, tags=tags)


def checkpoint_path(source: str, tracking_uri: str | None = None,
                    cache_dir: Path = Path(".quantgate/checkpoints")) -> Path:
    """The local folder of a version's source; a remote one is downloaded once into `cache_dir`."""
    scheme = urlparse(source).scheme
    if scheme in ("", "file"):
        from mlflow.utils.file_utils import local_file_uri_to_path

        path = Path(local_file_uri_to_path(source)).resolve()
        if not path.is_dir():
            raise CheckpointError(f"checkpoint {source!r}: no folder at {path}")
        return path
    if scheme == "models":
        raise CheckpointError(f"checkpoint {source!r}: resolve models:/ URIs through the registry "
                              "first (MlflowClient.get_model_version_download_uri)")
    target = Path(cache_dir).resolve() / hashlib.sha256(source.encode()).hexdigest()[:20]
    if target.is_dir():
        return target
    import mlflow

    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    try:
        local = mlflow.artifacts.download_artifacts(
            artifact_uri=source, dst_path=str(partial), tracking_uri=tracking_uri,
            registry_uri=tracking_uri)
    except Exception as err:  # MLflow raises its own, boto, requests...: all mean "not fetched"
        shutil.rmtree(partial, ignore_errors=True)
        raise CheckpointError(f"checkpoint {source!r} could not be downloaded: {err}") from err
    if not Path(local).is_dir():
        shutil.rmtree(partial, ignore_errors=True)
        raise CheckpointError(f"checkpoint {source!r} is a file, not a model folder")
    os.replace(local, target)
    shutil.rmtree(partial, ignore_errors=True)
    return target


def _link_tree(checkpoint: Path, target: Path) -> str:
    try:
        shutil.copytree(checkpoint, target, copy_function=os.link)
        return "hardlinked"
    except shutil.Error as err:  # per-file link errors: another file system, not the owner...
        log.warning("cannot hard-link %s into %s (%s): copying it", checkpoint, target, err)
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(checkpoint, target)
        return "copied"


def _ensure_model(client: MlflowClient, model: str) -> None:
    from mlflow.exceptions import MlflowException

    try:
        client.get_registered_model(model)
    except MlflowException as err:
        if err.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise
        client.create_registered_model(model)


# --- the A/B switch -------------------------------------------------------------------------------

def record_verdict(client: MlflowClient, model: str, version: str, decision: str,
                   reasons: list[str], report_uri: str, rollback_command: str, run_id: str) -> str:
    """Tag the version with its verdict; on go it becomes champion (the old one: previous)."""
    if decision not in ("go", "rollback"):
        raise RegistryError(f"unknown decision {decision!r}: {did_you_mean(decision, ('go', 'rollback'))}")
    version = str(version)
    _tag(client, model, version, {
        STATUS: decision, "quantgate.verdict": decision, "quantgate.reasons": "\n".join(reasons),
        "quantgate.report": report_uri, "quantgate.rollback_command": rollback_command,
        "quantgate.run_id": run_id,
    })
    if decision == "go":
        return _make_champion(client, model, version, "go")
    return f"{model}: v{version} rolled back; aliases untouched"


def promote(client: MlflowClient, model: str, version: str) -> str:
    """By hand: `version` becomes champion, the old champion previous. Returns the log line."""
    return _make_champion(client, model, str(version), "promote")


def rollback(client: MlflowClient, model: str) -> str:
    """By hand: champion <- previous, and `previous` is spent. Returns the log line."""
    aliases = _aliases(client, model)
    if PREVIOUS not in aliases:
        held = ", ".join(f"{a}=v{v}" for a, v in sorted(aliases.items())) or "none"
        raise RegistryError(f"model {model!r} has no {PREVIOUS!r} alias: nothing to roll back "
                            f"to (aliases: {held})")
    back = aliases[PREVIOUS]
    client.set_registered_model_alias(model, CHAMPION, back)
    client.delete_registered_model_alias(model, PREVIOUS)
    return _log_move(client, model, "rollback", aliases.get(CHAMPION), back)


def _make_champion(client: MlflowClient, model: str, version: str, action: str) -> str:
    old = _aliases(client, model).get(CHAMPION)
    if old == version:
        return f"{model}: v{version} is already {CHAMPION}; nothing moved"
    from mlflow.exceptions import MlflowException

    try:
        client.get_model_version(model, version)
    except MlflowException as err:
        raise RegistryError(f"model {model!r} has no version {version!r}: {err.message}") from err
    if old is not None:
        client.set_registered_model_alias(model, PREVIOUS, old)
    client.set_registered_model_alias(model, CHAMPION, version)
    return _log_move(client, model, action, old, version)


def _aliases(client: MlflowClient, model: str) -> dict[str, str]:
    from mlflow.exceptions import MlflowException

    try:
        return {alias: str(v) for alias, v in client.get_registered_model(model).aliases.items()}
    except MlflowException as err:
        raise RegistryError(f"registered model {model!r}: {err.message}") from err


def _log_move(client: MlflowClient, model: str, action: str, old: str | None, new: str) -> str:
    """Append `time, action, from->to, user` to the model's alias log (oldest lines drop first)."""
    when = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    line = f"{when}, {action}, {f'v{old}' if old else 'none'}->v{new}, {_user()}"
    lines = client.get_registered_model(model).tags.get(ALIAS_LOG, "").splitlines() + [line]
    while len("\n".join(lines)) > MODEL_TAG_LIMIT:
        lines.pop(0)
    client.set_registered_model_tag(model, ALIAS_LOG, "\n".join(lines))
    return f"{model}: {line}"


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no login name and no passwd entry (some containers)
        return f"uid {os.getuid()}"
