"""Keep what a run asks in its results folder before the first stage (gates/run_inputs.py)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from evalsets.contracts import prompts_by_id
from flows.spec import Spec
from gates.run_inputs import RunInputs
from infra.errors import QuantgateError
from infra.secrets import redact, redact_args
from load.profile import LoadProfile

log = logging.getLogger(__name__)


def keep_inputs(results_dir: Path, spec: Spec, profile: LoadProfile) -> Path:
    """The resolved spec, the sized load profile and each set's prompts by id; a set whose prompts
    cannot be listed (an lm-eval task's are lm-eval's) keeps none and its flips show hashes."""
    prompts = {}
    for evalset in spec.evalsets:
        try:
            prompts[evalset.name] = prompts_by_id(evalset.info)
        except (QuantgateError, OSError, ValueError) as err:
            log.info("inputs: no prompts kept for %s: %s", evalset.name, err)
    inputs = RunInputs(spec=_redacted(spec.model_dump(mode="json")), load_profile=profile,
                       load_profile_name=spec.load_profile)
    return inputs.keep(results_dir, prompts)


def _redacted(value: Any) -> Any:
    """The spec as kept: a command line's credential flags (`--api-key KEY` in extra_args) and
    any credential a text shows masked, as every other file of the run masks them."""
    if isinstance(value, dict):
        return {key: _redacted(item) for key, item in value.items()}
    if isinstance(value, list):
        if all(isinstance(item, str) for item in value):
            return redact_args(value)
        return [_redacted(item) for item in value]
    return redact(value) if isinstance(value, str) else value
