"""The registry side of the service against a real `mlflow server` process (sqlite backend)."""

from __future__ import annotations

import errno
import getpass
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import yaml
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

from flows.registry import (
    ALIAS_LOG,
    SPEC,
    STAGE,
    STATUS,
    VERSION_TAG_LIMIT,
    Candidate,
    RegistryError,
    checkpoint_path,
    mark,
    materialize,
    poll,
    promote,
    record_verdict,
    register_checkpoint,
    rollback,
)
from flows.spec import load_spec
from flows.webhook import make_app, serve_webhook
from infra.errors import SpecError
from tests.flows.checkpoints import make_checkpoint

SECRET = "registry-test-secret"
QUIET = {"MLFLOW_DISABLE_TELEMETRY": "true", "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false"}


class MlflowServer:
    """`mlflow server` on a free port, logging to a file; stopped with SIGTERM, then SIGKILL."""

    def __init__(self, folder: Path, *args: str):
        folder.mkdir(parents=True)
        self.folder, self.args = folder, args
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"

    def start(self) -> MlflowServer:
        env = os.environ | QUIET | {
            "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
            "MLFLOW_WEBHOOK_ALLOWED_SCHEMES": "http,https",  # the receiver here is plain http
            "MLFLOW_WEBHOOK_ALLOW_PRIVATE_IPS": "true",  # ...on 127.0.0.1
        }
        command = [str(Path(sys.executable).parent / "mlflow"), "server", "--backend-store-uri",
                   f"sqlite:///{self.folder / 'mlflow.db'}", "--host", "127.0.0.1",
                   "--port", str(self.port), "--workers", "1", *self.args]
        self.log = (self.folder / "server.log").open("w")
        self.process = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT, env=env,
                                        start_new_session=True, cwd=self.folder)
        return self

    def wait(self, timeout_s: float = 45) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                break
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.2)
        tail = (self.folder / "server.log").read_text()[-3000:]
        raise RuntimeError(f"mlflow server {self.args} did not become healthy:\n{tail}")

    def stop(self) -> None:
        for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
            try:
                os.killpg(self.process.pid, sig)  # its own session: the server and its workers
                self.process.wait(grace)
                break
            except subprocess.TimeoutExpired:
                continue
            except ProcessLookupError:
                break
        self.log.close()


@dataclass
class Registry:
    url: str  # the server stores artifacts itself (--artifacts-destination): mlflow-artifacts:/ URIs
    local: str  # an experiment whose artifact location is a plain folder
    template: Path
    announced: list = field(default_factory=list)


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    root = tmp_path_factory.mktemp("registry")
    server = MlflowServer(root / "server", "--artifacts-destination", str(root / "served"))
    with pytest.MonkeyPatch.context() as patch:
        for name, value in QUIET.items():
            patch.setenv(name, value)
        try:
            server.start().wait()
            client = MlflowClient(server.url)
            client.create_experiment("local", artifact_location=str(root / "artifacts"))
            found = Registry(server.url, "local", write_template(root / "specs"))
            receiver = serve_webhook(make_app(SECRET, lambda m, v: found.announced.append((m, v))))
            client.create_webhook("quantgate", receiver.url, ["model_version.created"], secret=SECRET)
            yield found
            receiver.stop()
        finally:
            server.stop()


def write_template(folder: Path) -> Path:
    """A runnable spec template whose paths are relative to its folder."""
    (folder / "profiles").mkdir(parents=True)
    (folder / "profiles" / "mine.yaml").write_text("{}\n")
    (folder / "policy.yaml").write_text("{}\n")
    template = folder / "template.yaml"
    template.write_text(yaml.safe_dump({
        "candidate": "template",
        "baseline": {"checkpoint": "../models/bf16"},
        "engine": {"kind": "vllm", "device": "cpu"},
        "stages": [
            {"name": "weights", "kind": "weights", "checkpoint": "../models/w8a16"},
            {"name": "activations", "kind": "activations", "checkpoint": "../models/w8a8"},
        ],
        "evalsets": [{"name": "math", "limit": 10}],
        "load_profile": "profiles/mine.yaml",
        "gate_policy": "policy.yaml",
    }, sort_keys=False))
    return template


def new_model(client: MlflowClient, registry: Registry) -> str:
    name = f"m-{uuid.uuid4().hex[:8]}"
    client.create_registered_model(name, tags={SPEC: str(registry.template)})
    return name


def test_a_registered_checkpoint_is_polled_once(registry: Registry, tmp_path: Path):
    client = MlflowClient(registry.url)
    model = new_model(client, registry)
    version = register_checkpoint(client, model, make_checkpoint(tmp_path / "ckpt"))
    run = client.get_run(version.run_id)
    assert version.source == f"{run.info.artifact_uri}/checkpoint"
    assert version.source.startswith("mlflow-artifacts:/")
    assert run.data.tags["quantgate.placement"] == "uploaded"

    seen: set[str] = set()
    assert poll(client, [model, "never-registered"], seen) == [Candidate(
        model=model, version="1", source=version.source, spec=registry.template,
        tracking_uri=registry.url)]
    assert poll(client, [model], seen) == []
    [again] = poll(client, [model], set())  # a restart before it was tagged: the key dedups
    assert again.key == f"{model}@1"
    mark(client, again, "queued", flow_run="abc")
    assert poll(client, [model], set()) == []
    tags = client.get_model_version(model, "1").tags
    assert (tags[STATUS], tags["quantgate.flow_run"]) == ("queued", "abc")


def test_the_server_announces_a_new_version_on_the_signed_webhook(registry: Registry, tmp_path):
    client = MlflowClient(registry.url)
    model = new_model(client, registry)
    register_checkpoint(client, model, make_checkpoint(tmp_path / "ckpt"))
    deadline = time.monotonic() + 20
    while (model, "1") not in registry.announced and time.monotonic() < deadline:
        time.sleep(0.1)
    assert (model, "1") in registry.announced


def test_a_version_without_a_spec_is_rejected_with_the_reason(registry: Registry, tmp_path):
    client = MlflowClient(registry.url)
    model = f"m-{uuid.uuid4().hex[:8]}"
    register_checkpoint(client, model, make_checkpoint(tmp_path / "ckpt"))
    register_checkpoint(client, model, make_checkpoint(tmp_path / "ckpt"),
                        tags={SPEC: str(tmp_path / "missing.yaml")})
    assert poll(client, [model], set()) == []
    first, second = (client.get_model_version(model, v).tags for v in ("1", "2"))
    assert first[STATUS] == second[STATUS] == "error"
    assert first["quantgate.error"].startswith("no spec template: tag quantgate.spec")
    assert second["quantgate.error"].endswith("missing.yaml' (tag quantgate.spec) is not a file here")


def test_materialize_puts_the_checkpoint_in_the_chosen_stage(registry: Registry, tmp_path):
    client = MlflowClient(registry.url)
    model = new_model(client, registry)
    register_checkpoint(client, model, make_checkpoint(tmp_path / "ckpt"))
    [candidate] = poll(client, [model], set())
    out = tmp_path / "specs"
    path = materialize(candidate, out)

    assert path == out / f"{model}-v1.yaml"
    spec = load_spec(path)
    folder = registry.template.parent
    models = folder.parent / "models"
    downloaded = spec.stages[1].checkpoint
    assert downloaded.parent == out / "checkpoints"
    assert (downloaded / "config.json").read_text() == (tmp_path / "ckpt" / "config.json").read_text()
    assert spec.candidate == f"{model}-v1"
    assert spec.baseline.checkpoint == models / "bf16"
    assert spec.stages[0].checkpoint == models / "w8a16"
    assert spec.load_profile == str(folder / "profiles" / "mine.yaml")
    assert spec.gate_policy == str(folder / "policy.yaml")

    first = candidate.model_copy(update={"stage": "weights"})
    assert load_spec(materialize(first, out)).stages[0].checkpoint == downloaded  # cached
    with pytest.raises(SpecError, match="asks for stage 'weight'.*did you mean 'weights'"):
        materialize(candidate.model_copy(update={"stage": "weight"}), out)


def test_a_local_artifact_store_gets_hard_links_not_copies(registry: Registry, tmp_path):
    client = MlflowClient(registry.url)
    checkpoint = make_checkpoint(tmp_path / "ckpt")
    version = register_checkpoint(client, "hardlinked", checkpoint, tags={STAGE: "weights"},
                                  experiment=registry.local)
    registered = checkpoint_path(version.source)
    assert registered != checkpoint
    inode = (checkpoint / "model.safetensors").stat().st_ino
    assert (registered / "model.safetensors").stat().st_ino == inode
    assert client.get_run(version.run_id).data.tags["quantgate.placement"] == "hardlinked"


def test_without_hard_links_the_checkpoint_is_copied(registry: Registry, tmp_path, monkeypatch):
    def cross_device(source: str, target: str) -> None:
        raise OSError(errno.EXDEV, "Invalid cross-device link", source)

    monkeypatch.setattr(os, "link", cross_device)
    client = MlflowClient(registry.url)
    checkpoint = make_checkpoint(tmp_path / "ckpt")
    version = register_checkpoint(client, "copied", checkpoint, experiment=registry.local)
    registered = checkpoint_path(version.source)
    assert client.get_run(version.run_id).data.tags["quantgate.placement"] == "copied"
    copy, original = registered / "model.safetensors", checkpoint / "model.safetensors"
    assert copy.read_bytes() == original.read_bytes()
    assert copy.stat().st_ino != original.stat().st_ino


def test_the_server_refuses_a_symlink_out_of_the_run(registry: Registry, tmp_path):
    """Why register_checkpoint hard-links: the server resolves symlinks before its check."""
    client = MlflowClient(registry.url)
    client.create_registered_model("symlinked")
    run = client.create_run(client.get_experiment_by_name(registry.local).experiment_id)
    artifacts = Path(run.info.artifact_uri)
    artifacts.mkdir(parents=True)
    (artifacts / "checkpoint").symlink_to(make_checkpoint(tmp_path / "ckpt"))
    with pytest.raises(MlflowException, match="contained within the artifact directory of the run"):
        client.create_model_version("symlinked", f"{artifacts}/checkpoint", run_id=run.info.run_id)


def test_a_sqlite_store_registers_and_polls_without_a_server(registry, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the store's artifacts default to ./mlruns
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    model = new_model(client, registry)
    version = register_checkpoint(client, model, make_checkpoint(tmp_path / "ckpt"))
    [candidate] = poll(client, [model], set())
    folder = checkpoint_path(candidate.source)
    assert folder == Path(version.source) and folder.is_relative_to(tmp_path / "mlruns")
    assert (folder / "config.json").is_file()


def test_verdicts_and_hand_moves_switch_the_aliases(registry: Registry, tmp_path):
    client = MlflowClient(registry.url)
    model = "ab-switch"
    for _ in range(3):
        register_checkpoint(client, model, make_checkpoint(tmp_path / "ckpt"), experiment=registry.local)

    def aliases() -> dict[str, str]:
        return client.get_registered_model(model).aliases

    record_verdict(client, model, "1", "go", ["all rules pass"], "r1", "cmd", "run1")
    assert aliases() == {"champion": "1"}
    record_verdict(client, model, "2", "go", ["x" * (VERSION_TAG_LIMIT + 10)], "file:///r2.html",
                   "quantgate rollback ab-switch", "run2")
    assert aliases() == {"champion": "2", "previous": "1"}
    tags = client.get_model_version(model, "2").tags
    assert (tags[STATUS], tags["quantgate.verdict"], tags["quantgate.report"],
            tags["quantgate.rollback_command"], tags["quantgate.run_id"]) == (
        "go", "go", "file:///r2.html", "quantgate rollback ab-switch", "run2")
    assert len(tags["quantgate.reasons"]) == VERSION_TAG_LIMIT

    said = record_verdict(client, model, "3", "rollback", ["accuracy -4.1 pp"], "r3", "c", "run3")
    assert aliases() == {"champion": "2", "previous": "1"}
    assert "aliases untouched" in said
    assert client.get_model_version(model, "3").tags[STATUS] == "rollback"

    line = promote(client, model, "3")
    assert aliases() == {"champion": "3", "previous": "2"}
    assert line.startswith(f"{model}: ") and line.endswith(f", promote, v2->v3, {getpass.getuser()}")
    line = rollback(client, model)
    assert aliases() == {"champion": "2"}
    assert ", rollback, v3->v2, " in line
    log = client.get_registered_model(model).tags[ALIAS_LOG].splitlines()
    assert [entry.split(", ")[1:3] for entry in log] == [
        ["go", "none->v1"], ["go", "v1->v2"], ["promote", "v2->v3"], ["rollback", "v3->v2"]]
    with pytest.raises(RegistryError, match="has no 'previous' alias: nothing to roll back to "
                                            r"\(aliases: champion=v2\)"):
        rollback(client, model)
    with pytest.raises(RegistryError, match="has no version '9'"):
        promote(client, model, "9")
