"""Paths a user hands in (a checkpoint, an eval set, a spec), followed without surprises: one line
for a name no file system holds (a NUL byte), a symlink loop, or a folder whose files lead out of it."""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def shown(path: Path | str) -> str:
    """The path as one line of text: control characters (a NUL, a newline) written as escapes."""
    text = str(path)
    return _CONTROL.sub(lambda match: repr(match.group())[1:-1], text)


def path_problem(path: Path | str) -> str | None:
    """Why `path` cannot name a file at all (a NUL byte, a line break in it), or None."""
    text = str(path)
    if "\x00" in text:
        return "holds a NUL byte (\\x00), which no file name can; write the path without it"
    if "\n" in text or "\r" in text:
        return "holds a line break; write the path on one line"
    return None


def follow(path: Path) -> tuple[Path | None, str | None]:
    """(where `path` leads, every symlink followed; or None and why it cannot be followed)."""
    problem = path_problem(path)
    if problem:
        return None, problem
    try:
        return path.resolve(strict=True), None
    except RuntimeError:  # Python before 3.13: a symlink loop
        return None, "is a symlink loop (it leads back to itself)"
    except OSError as err:
        if err.errno == errno.ELOOP:
            return None, "is a symlink loop (it leads back to itself)"
        if path.is_symlink():
            return None, f"is a symlink to {shown(os.readlink(path))}, which does not exist"
        if err.errno == errno.ENOENT:
            return None, "does not exist"
        return None, f"cannot be followed ({err.strerror or err})"


def links_out_of(folder: Path) -> list[tuple[Path, Path | None]]:
    """Entries under `folder` that are symlinks leading out of it (or nowhere), with where they
    lead (None: nowhere, a loop or a dangling link). Symlinked folders are not walked into."""
    root = folder.resolve()
    found: list[tuple[Path, Path | None]] = []
    for parent, folders, files in os.walk(folder):
        for name in [*folders, *files]:
            entry = Path(parent) / name
            if not entry.is_symlink():
                continue
            target, _ = follow(entry)
            if target is None or not target.is_relative_to(root):
                found.append((entry, target))
    return sorted(found)
