"""Where a failed stage's loss comes from: `diagnose` (offline, torch on the CPU, no engine)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from flows.commands.shared import console, fail
from infra.errors import QuantgateError

app = typer.Typer()


@app.command()
def diagnose(
    results_dir: Path,
    stage: Annotated[str | None, typer.Option(
        help="Diagnose this stage; default: every stage that failed a quality, divergence or "
        "perplexity rule.")] = None,
    checkpoint: Annotated[Path | None, typer.Option(
        help="The unquantized model folder, when the baseline's stored path is not here.")] = None,
    max_tokens: Annotated[int, typer.Option(
        min=16, help="Corpus tokens forwarded per group (whole sequences of the stage's scoring "
        "corpus, a fixed random sample): the time grows linearly with it.")] = 1024,
    layer_group: Annotated[int, typer.Option(
        min=1, help="Decoder layers quantized together in the per-layer sweep.")] = 1,
    threads: Annotated[int, typer.Option(min=1, help="torch threads.")] = 1,
) -> None:
    """Measure where a failed stage's loss comes from: its own format fake-quantized on one layer
    group or module kind at a time (K and V apart for a KV-cache stage), full-vocabulary KL per
    token on the stored scoring corpus, with block-bootstrap intervals. Writes diagnosis.json
    beside each stage's stage.json; `quantgate gate --report` then shows it."""
    from flows.diagnose import diagnose_run
    from gates.diagnosis import summary

    if not (results_dir / "manifest.json").is_file():
        fail(f"{results_dir} is not a results folder (no manifest.json)")
    try:
        found = diagnose_run(results_dir, stage, checkpoint=checkpoint, max_tokens=max_tokens,
                             layer_group=layer_group, threads=threads,
                             say=lambda line: console.print(escape(line), highlight=False))
    except QuantgateError as err:
        fail(str(err))
    if not found:
        console.print("no stage failed a quality, divergence or perplexity rule: nothing to "
                      "diagnose (name one with --stage)", highlight=False)
        return
    for diagnosis in found:
        console.print(f"[bold]{escape(diagnosis.stage)}[/] (failed: "
                      f"{escape(', '.join(diagnosis.failed_rules) or 'none')}; "
                      f"{diagnosis.forwards} groups in {diagnosis.seconds:.0f}s on "
                      f"{diagnosis.threads} thread{'s' * (diagnosis.threads != 1)})",
                      highlight=False)
        for line in summary(diagnosis):
            console.print(f"  {escape(line)}", highlight=False, soft_wrap=True)
        console.print(f"  written: {escape(str(results_dir / diagnosis.stage / 'diagnosis.json'))}",
                      highlight=False)
