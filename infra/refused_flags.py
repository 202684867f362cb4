"""Refusing an engine CLI argument a stage's extra_args must not carry: quantgate sets it itself,
or it changes what is served where the stage's derived axes cannot see it."""

from __future__ import annotations

import re
from collections.abc import Mapping

AXIS = "it changes what is served behind the derived axes"



def typed(engine: str) -> str:
    """The reason's tail for a flag quantgate sets from a typed field."""
    return f" instead (quantgate sets this flag from it; {engine} keeps the last of a repeated flag)"


def refused_flag(arg: str, refused: Mapping[str, str],
                 short: Mapping[str, str] | None = None) -> str | None:
    """Why a CLI argument is refused by the table `refused` (long flag -> reason), or None.
    Catches `--flag value`, `--flag=value`, `--flag.key=value` (JSON keys), underscores for
    dashes, `--no-flag`, argparse abbreviations (`--max-model`) and `short` aliases (`-q fp8`)."""
    if arg.startswith("--"):
        name = re.split(r"[=.]", arg[2:], maxsplit=1)[0].replace("_", "-")
        if not name:
            return None
        if name.startswith("no-") and name[3:] in refused:
            name = name[3:]
        # argparse takes any unambiguous prefix of a long flag; an ambiguous one fails anyway.
        matches = [flag for flag in refused if flag == name] or \
            [flag for flag in refused if flag.startswith(name)]
    elif arg.startswith("-"):
        matches = [long for alias, long in (short or {}).items() if arg.startswith(alias)]
    else:
        return None
    if not matches:
        return None
    flag = matches[0]
    return f"{arg!r} (--{flag}) is not accepted in extra_args: {refused[flag]}"


def check_args(args: list[str], refused: Mapping[str, str],
               short: Mapping[str, str] | None = None) -> list[str]:
    """`args` unchanged, or ValueError naming every refused one."""
    problems = [reason for arg in args if (reason := refused_flag(arg, refused, short))]
    if problems:
        raise ValueError("; ".join(problems))
    return args
