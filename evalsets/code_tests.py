"""Code unit tests as HumanEval, MBPP or plain asserts ship them, and the proof that they can fail."""

from __future__ import annotations

import ast
import builtins
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from evalsets.code.grading import MEMORY_MB, TIMEOUT_S
from evalsets.sandbox import SandboxResult, run_untrusted, run_untrusted_many

TESTS_STYLES = ("auto", "asserts", "humaneval", "mbpp")


@dataclass(frozen=True)
class Convention:
    """Where a convention's public data keeps what the tests need, when the spec names no field."""

    prefix: tuple[str, ...] = ()  # code the answer continues
    setup: tuple[str, ...] = ()  # code run before the tests
    reference: tuple[str, ...] = ()  # a solution that passes the tests


CONVENTIONS = {
    # The harness runs prompt + completion, then the tests, then check(entry_point).
    "humaneval": Convention(prefix=("prompt",), reference=("canonical_solution",)),
    # MBPP: test_setup_code (original) or test_imports (sanitized); the solution is `code`.
    "mbpp": Convention(setup=("test_setup_code", "test_imports"), reference=("code",)),
    "asserts": Convention(reference=("canonical_solution",)),
}
# Rows proved per round: a broken set stops after the round that found its first bad row.
PROOF_ROUND = 64


class UnusableTests(ValueError):
    """A row's tests cannot be run as declared; `part` is 'tests', 'entry_point' or 'setup'."""

    def __init__(self, part: str, why: str) -> None:
        super().__init__(why)
        self.part = part


@dataclass(frozen=True)
class CodeTask:
    """One row's tests in runnable form: what runs after the answer, in its namespace."""

    style: str  # asserts | humaneval | mbpp
    entry_point: str
    tests: str
    prefix: str = ""  # code the answer continues (HumanEval: imports, signature, docstring)

    def program(self, code: str) -> str:
        """The answer as a program: a whole function after the prefix's imports and helpers
        (the prefix's own unfinished definition dropped), or a body that continues the prefix."""
        if not self.prefix.strip():
            return code
        if _defines(code, self.entry_point):
            candidates = [_header(self.prefix, self.entry_point) + code, code]
        else:
            prefix = self.prefix if self.prefix.endswith("\n") else self.prefix + "\n"
            candidates = [prefix + code, prefix + _indented(code),
                          prefix + _indented(code, first_only=True)]
        # Parsing runs nothing; a program that never compiles goes as meant, to fail there.
        return next((program for program in candidates if _compiles(program)), candidates[0])

    def run(self, code: str) -> SandboxResult:
        return run_untrusted(self.program(code), self.tests, timeout_s=TIMEOUT_S,
                             memory_mb=MEMORY_MB)

    def stub(self) -> str:
        """A wrong answer any real test fails: the entry point returns None for every input."""
        return f"def {self.entry_point}(*args, **kwargs):\n    return None\n"


def listed_tests(value: Any) -> list[str] | None:
    """MBPP's test_list: a list of assert strings (JSON text of one in a CSV), else None."""
    if isinstance(value, str) and value.lstrip().startswith("["):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return value
    return None


def defines_uncalled_check(tests: str) -> bool:
    """HumanEval's shape: the tests define `check(candidate)` and leave calling it to the harness."""
    try:
        tree = ast.parse(tests)
    except SyntaxError:
        return False
    checks = [node for node in tree.body if _is_function(node, "check")]
    if not checks:
        return False
    rest = [node for node in tree.body if node not in checks]
    return not any(isinstance(sub, ast.Call) and isinstance(sub.func, ast.Name)
                   and sub.func.id == "check" for node in rest for sub in ast.walk(node))


def detect_style(tests: Any) -> str:
    """The convention a row's tests follow: a list is MBPP's test_list, text that defines
    check() and never calls it is HumanEval's, any other text is plain asserts."""
    if listed_tests(tests) is not None:
        return "mbpp"
    return "humaneval" if defines_uncalled_check(str(tests)) else "asserts"


def first_called(tests: str) -> str | None:
    """The first function the tests call that is neither a builtin nor bound in the tests."""
    tree = ast.parse(tests)
    bound = {node.name for node in ast.walk(tree)
             if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)}
    bound |= {node.id for node in ast.walk(tree)
              if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store)}
    bound |= {(alias.asname or alias.name).split(".")[0] for node in ast.walk(tree)
              if isinstance(node, ast.Import | ast.ImportFrom) for alias in node.names}
    calls = sorted((node.lineno, node.col_offset, node.func.id) for node in ast.walk(tree)
                   if isinstance(node, ast.Call) and isinstance(node.func, ast.Name))
    return next((name for *_, name in calls
                 if name not in bound and not hasattr(builtins, name)), None)


def build_task(tests: Any, entry_point: str | None, style: str = "auto", setup: Any = "",
               prefix: str = "") -> CodeTask:
    """A row's tests under its convention (`style` 'auto': detected); UnusableTests says why not."""
    found = detect_style(tests)
    style = found if style == "auto" else style
    listed = listed_tests(tests)
    if style == "mbpp":
        if listed is None:
            raise UnusableTests("tests", "tests_style 'mbpp' expects a list of assert statements "
                                f"(MBPP's test_list), not a {type(tests).__name__}")
        if not listed:
            raise UnusableTests("tests", "the test list is empty")
        body = "\n".join(listed)
    elif listed is not None:
        raise UnusableTests("tests", f"tests_style {style!r} expects the tests as text, not a list "
                                     "(a list of asserts is tests_style 'mbpp')")
    else:
        body = str(tests)
    if not body.strip():
        raise UnusableTests("tests", "the tests are empty")
    _parse("tests", body)
    setup_text = "\n".join(setup) if isinstance(setup, list) else str(setup or "")
    _parse("setup", setup_text)
    if style == "humaneval" and not any(_is_function(n, "check") for n in ast.parse(body).body):
        raise UnusableTests("tests", "tests_style 'humaneval' expects tests that define "
                                     "check(candidate); these define no check function")
    if entry_point is None:
        if style == "humaneval":
            raise UnusableTests("entry_point", "HumanEval tests are run as check(<entry point>): "
                                               "name the field that holds it (entry_point_field)")
        entry_point = first_called(setup_text + "\n" + body)
        if entry_point is None:
            raise UnusableTests("tests", "the tests call no function to test; name it with "
                                         "entry_point_field")
    if not entry_point.isidentifier():
        raise UnusableTests("entry_point", f"{entry_point!r} is not a Python function name")
    program = "\n".join(part for part in (setup_text, body) if part.strip())
    program += "" if program.endswith("\n") else "\n"
    if style == "humaneval":
        program += f"\n\ncheck({entry_point})\n"
    return CodeTask(style=style, entry_point=entry_point, tests=program, prefix=prefix)


@dataclass(frozen=True)
class Unproven:
    """A row whose tests are not shown to tell a right answer from a wrong one."""

    index: int  # into the rows proved
    part: str  # 'tests', 'prefix' or 'reference'
    why: str


def prove(tasks: Sequence[CodeTask], references: Sequence[str | None],
          workers: int | None = None) -> Unproven | None:
    """The first row (in order) whose tests pass a stub of its entry point, or whose reference
    solution (where it has one) fails them; runs the sandboxes in parallel, a round at a time."""
    for start in range(0, len(tasks), PROOF_ROUND):
        jobs, owners = [], []
        for index in range(start, min(start + PROOF_ROUND, len(tasks))):
            task, reference = tasks[index], references[index]
            jobs.append((task.program(task.stub()), task.tests))
            owners.append((index, "stub"))
            if reference is not None:
                jobs.append((task.program(reference), task.tests))
                owners.append((index, "reference"))
        results = run_untrusted_many(jobs, workers, timeout_s=TIMEOUT_S, memory_mb=MEMORY_MB)
        for (index, role), result in zip(owners, results, strict=True):
            found = _judged(tasks[index], role, result)
            if found is not None:
                return Unproven(index, *found)
    return None


def _judged(task: CodeTask, role: str, result: SandboxResult) -> tuple[str, str] | None:
    reason = " ".join(result.reason.split())
    if role == "reference":
        if result.passed:
            return None
        hint = ("; a function body needs the code it continues: name that field with prefix_field"
                if not task.prefix and reason.startswith("error in solution.py") else "")
        return "reference", (f"the reference solution fails its own tests ({reason}); fix it or "
                             f"the tests{hint}")
    stub = f"a stub {task.entry_point}() that returns None"
    if result.passed:
        hint = (f"; they define check() and never call it: set tests_style: humaneval (runs "
                f"check({task.entry_point}))" if task.style != "humaneval"
                and defines_uncalled_check(task.tests) else
                f"; make them assert on what {task.entry_point}() returns")
        return "tests", f"the tests pass {stub}, so they cannot fail a wrong answer{hint}"
    if reason.startswith(("error in solution.py", "error in guard.py")):
        return "prefix", (f"the program fails before its tests run, even with {stub} ({reason}); "
                          "the tests are not shown to fail a wrong answer")
    return None


def _is_function(node: ast.AST, name: str) -> bool:
    return isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name


def _parse(part: str, text: str) -> None:
    try:
        ast.parse(text)
    except SyntaxError as exc:
        raise UnusableTests(part, f"not valid Python: line {exc.lineno}: {exc.msg}") from exc


def _compiles(program: str) -> bool:
    try:
        compile(program, "<answer>", "exec")
    except (SyntaxError, ValueError):
        return False
    return True


def _definition(entry_point: str) -> re.Pattern[str]:
    return re.compile(rf"^(?:async[ \t]+)?def[ \t]+{re.escape(entry_point)}[ \t]*\(", re.MULTILINE)


def _defines(code: str, entry_point: str) -> bool:
    return _definition(entry_point).search(code) is not None


def _header(prefix: str, entry_point: str) -> str:
    """The prefix up to its own definition of the entry point: its imports and helpers."""
    found = list(_definition(entry_point).finditer(prefix))
    if found:
        return prefix[: found[-1].start()]
    return prefix if _compiles(prefix) else ""


def _indented(code: str, first_only: bool = False) -> str:
    """A body written from column 0 (or with its first line's indent stripped), as a body."""
    lines = code.splitlines(keepends=True)
    if first_only:
        return "    " + "".join(lines[:1]).lstrip() + "".join(lines[1:])
    return "".join("    " + line if line.strip() else line for line in lines)
