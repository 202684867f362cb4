"""What every command shares: the consoles, the one-line `fail`, the verdict table (the quiet
environment a run starts with is infra.quiet's)."""

from __future__ import annotations

import os

import typer
from rich.console import Console, ConsoleDimensions
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from infra.secrets import redact

PLAIN_WIDTH = 240


class _Console(Console):
    """rich's console, its width read at each print rather than once per process: COLUMNS when
    set, else the terminal's. Off a terminal (a CI log, a pipe) rich would fold every table at 80
    columns ("activatio / ns"): there tables take the width they need (PLAIN_WIDTH)."""

    @property
    def size(self) -> ConsoleDimensions:
        height = super().size.height
        columns = os.environ.get("COLUMNS", "")
        if columns.isdigit() and int(columns) > 0:
            return ConsoleDimensions(int(columns), height)
        if not self.is_terminal:
            return ConsoleDimensions(PLAIN_WIDTH, height)
        try:
            return ConsoleDimensions(os.get_terminal_size(self.file.fileno()).columns, height)
        except (AttributeError, OSError, ValueError):  # a terminal without a file number
            return ConsoleDimensions(super().size.width, height)


def _console(stderr: bool = False) -> Console:
    return _Console(stderr=stderr)


console = _console()
err_console = _console(stderr=True)



def fail(message: str) -> None:
    # Messages quote user values ("^[a-z]*$", "[x]", r"\["): a Text is printed as it is, where
    # rich's markup (even escaped: it reads a backslash before a bracket) would change them.
    err_console.print(Text.assemble(("error:", "bold red"), f" {redact(message)}"), highlight=False,
                      soft_wrap=True)
    raise typer.Exit(2)


def print_verdict(verdict) -> None:
    # Names, reasons and commands come from stored records: rich must print them, not read them.
    table = Table(title=escape(f"{verdict.candidate}: {verdict.decision.upper()}"))
    for column in ("stage", "kind", "parent", "result", "failed checks"):
        table.add_column(column, overflow="fold")
    for stage in verdict.stages:
        # Reasons hold CIs such as "[x0.90, x1.03]", which rich would read as markup tags.
        failed = "\n".join(escape(f"{c.rule}: {c.reason}") for c in stage.failures) or "-"
        result = "[green]pass[/]" if stage.passed else "[red]fail[/]"
        table.add_row(escape(stage.stage), escape(stage.kind), escape(str(stage.parent)), result,
                      failed)
    console.print(table)
    for advisory in verdict.advisories:
        console.print(f"[yellow]not established:[/] {escape(advisory)}", soft_wrap=True)
    if verdict.decision == "rollback":
        console.print(f"rollback to stage [bold]{escape(str(verdict.accepted_stage))}[/]:")
        console.print(escape(redact(verdict.rollback_command or "(no stage was accepted)")),
                      soft_wrap=True, highlight=False)
        if verdict.rollback_plan is not None and verdict.rollback_plan.skipped():
            console.print(f"({escape(verdict.rollback_plan.skipped())})", soft_wrap=True,
                          highlight=False)
    for judged in verdict.repairs:  # built after the rollback: the decision above stands
        color = "green" if judged.decision == "go" else "red"
        console.print(f"repair of {escape(judged.repairs)}: stage {escape(judged.stage)} "
                      f"({escape(judged.configuration)}): [{color}]{judged.decision.upper()}[/]"
                      + escape("".join(f"\n  {reason}" for reason in judged.reasons)),
                      soft_wrap=True, highlight=False)
