"""The `quantgate` commands by concern, each module a nameless typer app that flows/cli.py adds."""
