"""References in a JSON Schema: only local ones ('#/...') are followed (the scorers' schemas and
the items' own, asked with guided decoding: evalsets.structured)."""

from __future__ import annotations

from typing import Any

_REF_KEYS = ("$ref", "$dynamicRef", "$recursiveRef")


def remote_ref(schema: Any) -> str | None:
    """The first reference in a JSON Schema that is not local ('#/...'), or None. A remote or
    relative `$ref` would be fetched (by the validator or the engine's guided decoding) from
    somewhere the run does not control, and could change between the baseline and a stage."""
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for key, value in node.items():
                if key in _REF_KEYS and isinstance(value, str) and not value.startswith("#"):
                    return value
                stack.append(value)
        elif isinstance(node, list):
            stack.extend(node)
    return None


def local_refs_problem(schema: Any) -> str | None:
    """Why a schema is refused for its references, or None."""
    found = remote_ref(schema)
    if found is None:
        return None
    return (f"$ref {found!r} is not local: only references into the schema itself ('#/...') "
            "are followed; inline the referenced schema under $defs and refer to '#/$defs/...'")
