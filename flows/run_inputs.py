"""Keep what a run asks in its results folder before the first stage (gates/run_inputs.py)."""

from __future__ import annotations

import logging
from pathlib import Path

from evalsets.contracts import prompts_by_id
from flows.spec import Spec
from gates.run_inputs import RunInputs
from infra.errors import QuantgateError
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
    inputs = RunInputs(spec=spec.model_dump(mode="json"), load_profile=profile,
                       load_profile_name=spec.load_profile)
    return inputs.save(results_dir, prompts)
