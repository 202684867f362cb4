"""The code a task folder names, checked as text: `validate` reads it with `ast`, never imports it.

A task.yaml's `!function module.fn` and a contract's `check: module.fn` are the user's code; it runs
at scoring (lm-eval imports it then), not while a spec is validated. Here each reference must name
a Python file that parses and defines the function at its top level.
"""

from __future__ import annotations

import ast
import importlib.machinery
import sys
from pathlib import Path
from typing import Any

from infra.errors import SpecError, did_you_mean


class FunctionRef(str):
    """A `!function` value of a task.yaml, kept as its text (`utils.process_docs`)."""


def _module_file(base_dir: Path, module: str) -> Path | None:
    """Where lm-eval would find `module`: a file next to the YAML first, else on sys.path;
    located by the import system's finders, which read directories and do not execute code."""
    local = base_dir / f"{module.replace('.', '/')}.py"
    if local.is_file():
        return local
    search: list[str] | None = None
    found = None
    for part in module.split("."):
        if search is None and part in sys.builtin_module_names:
            return Path(f"<built-in {part}>")
        found = importlib.machinery.PathFinder.find_spec(part, search)
        if found is None:
            return None
        search = list(found.submodule_search_locations or [])
    origin = getattr(found, "origin", None)
    return Path(origin) if origin else None


def _defined_names(source: Path, where: str) -> tuple[set[str], set[str]]:
    """(every top-level name the file binds, the functions among them)."""
    try:
        tree = ast.parse(source.read_bytes(), filename=str(source))
    except (OSError, SyntaxError, ValueError, RecursionError) as exc:
        detail = f"line {exc.lineno}: {exc.msg}" if isinstance(exc, SyntaxError) else str(exc)
        raise SpecError(f"{where}: {source} does not parse as Python ({detail}); fix the "
                        "file") from exc
    names: set[str] = set()
    functions: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            functions.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names, functions


def check_reference(base_dir: Path, reference: str, where: str) -> None:
    """`module.fn` names a function defined in a Python file lm-eval would load (SpecError)."""
    module, _, function = reference.rpartition(".")
    if not module or not function:
        raise SpecError(f"{where}: {reference!r} is not module.function (e.g. utils.process_docs)")
    try:
        source = _module_file(base_dir, module)
    except (ImportError, ValueError, OSError):
        source = None
    if source is None:
        raise SpecError(f"{where}: {reference!r}: no {module.replace('.', '/')}.py in {base_dir} "
                        "and no installed module of that name; add the file or fix the name")
    if source.suffix != ".py":  # a built-in or compiled module: its names cannot be read as text
        return
    names, functions = _defined_names(source, where)
    if function not in names:
        hint = did_you_mean(function, tuple(sorted(functions))) if functions else "it defines none"
        raise SpecError(f"{where}: {reference!r}: {source} defines no {function!r} at its top "
                        f"level; {hint}")


def references(config: Any) -> list[tuple[str, FunctionRef]]:
    """Every `!function` value in a loaded task.yaml, with its dotted key (`filter_list[0]...`)."""
    found: list[tuple[str, FunctionRef]] = []
    stack: list[tuple[str, Any]] = [("", config)]
    while stack:
        key, value = stack.pop()
        if isinstance(value, FunctionRef):
            found.append((key, value))
        elif isinstance(value, dict):
            stack.extend((f"{key}.{k}" if key else str(k), v) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((f"{key}[{i}]", v) for i, v in enumerate(value))
    return sorted(found)


def check_task_functions(task_yaml: Path, config: Any) -> None:
    """Each `!function` of a task.yaml names a defined function (SpecError naming the key)."""
    for key, reference in references(config):
        check_reference(task_yaml.parent, reference, f"{task_yaml}: {key}")


# lm-eval's filters that compile a pattern from the task YAML (RegexFilter, MultiChoiceRegexFilter).
PATTERN_KEYS = ("regex_pattern",)


def check_task_patterns(task_yaml: Path, config: Any) -> None:
    """Each regular expression a task.yaml gives lm-eval's filters compiles without a warning
    and cannot backtrack exponentially (lm-eval searches with re, no time bound)."""
    from evalsets.patterns import regex_problem

    stack: list[tuple[str, Any]] = [("", config)]
    while stack:
        key, value = stack.pop()
        if isinstance(value, dict):
            for name, item in value.items():
                where = f"{key}.{name}" if key else str(name)
                if name in PATTERN_KEYS and isinstance(item, str):
                    problem = regex_problem(item)
                    if problem is not None:
                        raise SpecError(f"{task_yaml}: {where}: {problem}")
                else:
                    stack.append((where, item))
        elif isinstance(value, list):
            stack.extend((f"{key}[{i}]", v) for i, v in enumerate(value))
