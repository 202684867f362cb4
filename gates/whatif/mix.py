"""Which config group quantizes each decoder matmul of a compressed-tensors checkpoint, as
compressed-tensors matches them (its `match_targets`: an exact module name first, then a `re:`
pattern, then the class name `Linear`; `ignore` wins over all), and how many weights each holds.

A mixed-precision checkpoint (the repair of a rollback keeps its costliest layers in bf16 or INT8)
declares its formats per module; what it streams per token is then the weights' mix, which the
capacity what-if reads from here instead of refusing two formats."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from gates.whatif.shape import ModelShape


def decoder_matmuls(shape: ModelShape) -> dict[str, int]:
    """Each decoder matmul's module name and weight count."""
    return {f"model.layers.{layer}.{name}": count
            for layer in range(shape.num_layers) for name, count in shape.layer_matmuls.items()}


def _matches(name: str, target: str) -> int | None:
    """How specifically `target` names module `name` (0 exact, 1 pattern, 2 class); None: not."""
    if target.startswith("re:"):
        try:
            return 1 if re.match(target[3:], name) else None
        except re.error as err:
            raise ValueError(f"target {target!r} is no regular expression: {err}") from err
    if target == name:
        return 0
    return 2 if target == "Linear" else None


def module_groups(qc: Mapping[str, Any], shape: ModelShape) -> dict[str, str | None]:
    """Each decoder matmul's config group (None: left in the model's dtype). ValueError when a
    group names a module (exactly or by pattern) that is none of this model's decoder matmuls:
    the config was written for other module names, and where its formats go is unknown."""
    groups = qc.get("config_groups") or {}
    ignore = qc.get("ignore") or []
    names = list(decoder_matmuls(shape))
    for body in groups.values():
        for target in body.get("targets") or []:
            if target != "Linear" and not any(_matches(name, target) is not None for name in names):
                raise ValueError(f"target {target!r} names no decoder matmul of this model")
    found: dict[str, str | None] = {}
    for name in names:
        if any(_matches(name, target) is not None for target in ignore):
            found[name] = None
            continue
        ranked = [(rank, group) for group, body in groups.items()
                  for target in body.get("targets") or []
                  if (rank := _matches(name, target)) is not None]
        found[name] = min(ranked)[1] if ranked else None
    return found
