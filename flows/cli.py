"""The `quantgate` command: validate a spec, run an acceptance, re-gate stored results."""

from __future__ import annotations

import signal
import sys

import typer
import typer.core
from click import Context
from rich.markup import escape

from flows.commands import diagnose, prepare, results, running, service, whatif
from flows.commands.shared import err_console
from infra.secrets import redact

# The order `quantgate --help` lists the commands in (one module held them all, in this order);
# each concern's module adds its own, a command not named here is listed last.
HELP_ORDER = ("validate", "new-evalset", "run", "gate", "whatif", "compare", "serve", "submit",
              "status", "register", "promote", "rollback", "load-ui", "prepare-demo", "formats",
              "prepare-candidates", "diagnose")


class _Commands(typer.core.TyperGroup):
    def list_commands(self, ctx: Context) -> list[str]:
        names = super().list_commands(ctx)
        return sorted(names, key=lambda name: HELP_ORDER.index(name) if name in HELP_ORDER
                      else len(HELP_ORDER))


app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__, cls=_Commands)
for commands in (running, results, whatif, service, prepare, diagnose):
    app.add_typer(commands.app)  # no name: each command stays at the top level


def _exit_on_sigterm(signum: int, frame: object) -> None:
    # Raising unwinds the flow: engines are stopped and MLflow runs marked FAILED on the way out.
    raise SystemExit(128 + signum)


def main() -> None:
    """The console script. Exit 1 means rollback, so a crash must never end with it: anything
    that escapes (a bug, a broken install) is an error, exit 2."""
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        _app()
    except KeyboardInterrupt:  # before `run` handles the signals itself, or another command
        command = " ".join(["quantgate", *sys.argv[1:2]])
        err_console.print(escape(f"interrupted by Ctrl-C: `{command}` stopped; run it again"),
                          highlight=False, soft_wrap=True)
        sys.exit(130)
    except OSError as err:
        # A full disk, a folder taken away, a permission: the machine's state, not a bug.
        where = f" ({err.filename})" if err.filename else ""
        err_console.print(f"[bold red]error:[/] {escape(redact(f'{err.strerror or err}{where}'))} (an "
                          f"environment problem, not a bug{escape(_kept_results())})",
                          highlight=False, soft_wrap=True)
        sys.exit(2)
    except Exception as err:  # noqa: BLE001 - the last line of defence of the exit-code contract
        import traceback

        sys.stderr.write(redact(traceback.format_exc()))
        err_console.print(f"[bold red]error:[/] {escape(redact(f'unexpected {type(err).__name__}: {err}'))} "
                          f"(a bug; the traceback is above{escape(_kept_results())})",
                          highlight=False, soft_wrap=True)
        sys.exit(2)


def _app() -> None:
    from flows.interrupt import finish, interrupted

    try:
        app()
    finally:
        if interrupted() is not None:  # `run` was interrupted: one line and a bounded exit
            finish()


def _kept_results() -> str:
    """', measured results are kept under DIR' when the configured results folder holds any."""
    try:
        from flows.settings import Settings

        folder = Settings().results_dir
        if folder.is_dir() and any(folder.iterdir()):
            return f"; measured results are kept under {folder.resolve()}"
    except Exception:  # noqa: BLE001, S110 - a crash report must not crash on its way out
        pass
    return ""


if __name__ == "__main__":
    main()
