"""`quantgate register` refuses, before any store is opened, what the service would only fail at
intake (or what it should never publish): a checkpoint with files linked in from outside its
folder, a Hugging Face cache snapshot, a broken checkpoint, a spec template that is not there or
cannot take the checkpoint, a model name a store or the registry's filter cannot hold. One line,
exit 2, nothing written."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from mlflow import MlflowClient
from typer.testing import CliRunner

from flows.cli import app
from flows.registry import SPEC, STAGE, poll
from tests.flows.checkpoints import make_checkpoint
from tests.flows.test_cli_stores import files, here, one_line  # noqa: F401 - `here` is a fixture

REPO = Path(__file__).parents[2]
runner = CliRunner()


def linked_file(folder: Path) -> list[str]:
    checkpoint = make_checkpoint(folder / "ckpt")
    (folder / "secret.txt").write_text("not a model file")
    os.symlink(folder / "secret.txt", checkpoint / "notes.txt")
    return ["m", str(checkpoint)]


def linked_weights(folder: Path) -> list[str]:
    checkpoint = make_checkpoint(folder / "ckpt")
    shutil.move(checkpoint / "model.safetensors", folder / "weights.safetensors")
    os.symlink(folder / "weights.safetensors", checkpoint / "model.safetensors")
    return ["m", str(checkpoint)]


def hf_snapshot(folder: Path) -> list[str]:
    repo = folder / "hub" / "models--org--tiny"
    snapshot, blobs = repo / "snapshots" / "0123abc", repo / "blobs"
    source = make_checkpoint(folder / "source")
    snapshot.mkdir(parents=True)
    blobs.mkdir()
    for path in source.iterdir():
        shutil.move(path, blobs / path.name)
        os.symlink(Path("../../blobs") / path.name, snapshot / path.name)
    return ["m", str(snapshot)]


def dangling(folder: Path) -> list[str]:
    checkpoint = make_checkpoint(folder / "ckpt")
    os.symlink(folder / "gone.json", checkpoint / "generation_config.json")
    return ["m", str(checkpoint)]


def spec(path: str, *more: str):
    def args(folder: Path) -> list[str]:
        return ["m", str(make_checkpoint(folder / "ckpt")), "--spec", path.format(here=folder),
                *more]
    return args


def spec_loop(folder: Path) -> list[str]:
    os.symlink(folder / "loop.yaml", folder / "loop.yaml")
    return spec("{here}/loop.yaml")(folder)


def broken_weights(folder: Path) -> list[str]:
    checkpoint = make_checkpoint(folder / "ckpt")
    (checkpoint / "model.safetensors").write_bytes(b"\0" * 64)
    return ["m", str(checkpoint)]


def name(model: str):
    return lambda folder: [model, str(make_checkpoint(folder / "ckpt"))]


CASES = [
    ("a file linked in from outside", linked_file,
     "error: checkpoint {here}/ckpt: notes.txt is a symlink to {here}/secret.txt, outside the "
     "checkpoint folder; registering it would publish what it points at: copy the file into the "
     "folder (`cp -rL {here}/ckpt DIR`, then register DIR)"),
    ("weights linked in from outside", linked_weights,
     "error: checkpoint {here}/ckpt: model.safetensors is a symlink to {here}/weights.safetensors, "
     "outside the checkpoint folder"),
    ("a Hugging Face cache snapshot", hf_snapshot,
     "error: checkpoint {here}/hub/models--org--tiny/snapshots/0123abc is a Hugging Face cache "
     "snapshot (its files are links into the cache's blobs); copy it out first, e.g. `hf download "
     "REPO --revision 0123abc --local-dir DIR`"),
    ("a dangling link", dangling,
     "error: checkpoint {here}/ckpt: generation_config.json is a symlink that leads to no file"),
    ("weights that are not safetensors", broken_weights,
     "error: {here}/ckpt/model.safetensors is not a safetensors file: its header length field "
     "reads 0"),
    ("a spec template that is not there", spec("{here}/missing.yaml"),
     "error: spec template {here}/missing.yaml does not exist; pass --spec a spec file"),
    ("a spec template that is a folder", spec("{here}"),
     "error: spec template {here} is not a file; pass --spec a spec file"),
    ("a spec template that is a symlink loop", spec_loop,
     "error: spec template {here}/loop.yaml is a symlink loop (it leads back to itself)"),
    ("a stage the template lacks", spec(str(REPO / "flows/specs/demo.yaml"), "--stage", "weight"),
     f"error: {REPO}/flows/specs/demo.yaml: m@new asks for stage 'weight' (tag quantgate.stage), "
     "which the template lacks; did you mean 'weights'?"),
    ("a control character in the name", name("team\nmodel"),
     "error: model name 'team\\nmodel' holds a control character (a NUL byte, a line break), "
     "which a store cannot hold; choose another name, such as 'team-model'"),
    ("a name longer than MLflow's column", name("m" * 300),
     "is 300 characters long, more than MLflow's 256"),
    ("both quote marks in the name", name("""bob's "model\""""),
     "holds both quote marks, which the registry's search filter cannot quote"),
    ("a space around the name", name("model "),
     "error: model name 'model ' starts or ends with a space"),
]


@pytest.mark.parametrize("make, expected", [case[1:] for case in CASES],
                         ids=[case[0] for case in CASES])
def test_register_refuses_it_in_one_line_and_writes_nothing(here, make, expected):  # noqa: F811
    args = make(here)
    before = files(here)
    line = one_line(["register", *args])
    assert line.startswith(expected.format(here=here)) or expected in line, line
    assert files(here) == before  # no store, no version


def test_a_template_that_takes_the_checkpoint_registers_with_its_path(here):  # noqa: F811
    result = runner.invoke(app, ["register", "smollm", str(REPO / "models/smollm2-135m-w8a8"),
                                 "--spec", str(REPO / "flows/specs/demo-avx2.yaml"), "--stage",
                                 "activations"])
    assert result.exit_code == 0, (result.output, repr(result.exception))
    client = MlflowClient(f"sqlite:///{here / 'mlflow.db'}")
    tags = client.get_model_version("smollm", "1").tags
    assert tags[SPEC] == str(REPO / "flows/specs/demo-avx2.yaml") and tags[STAGE] == "activations"


def test_a_name_with_a_quote_is_registered_and_polled(here):  # noqa: F811
    """The registry's filter quotes the name with the mark it lacks: `name='bob's'` would not parse."""
    template = REPO / "flows/specs/demo-avx2.yaml"
    model = "bob's model"
    result = runner.invoke(app, ["register", model, str(make_checkpoint(here / "ckpt")), "--spec",
                                 str(template)])
    assert result.exit_code == 0, (result.output, repr(result.exception))
    client = MlflowClient(f"sqlite:///{here / 'mlflow.db'}")
    [candidate] = poll(client, [model], set())
    assert candidate.key == f"{model}@1" and candidate.spec == template
