"""Checks before any engine starts: a spec, its stages, sets, profile, policy and power."""

from __future__ import annotations

from pathlib import Path

from evalsets.contracts import check_chat_template, check_prompts_fit, fit_to_context, validate_sets
from evalsets.structured import check_schema_items
from flows.engines import kv_tokens_needed, plan_run_placement
from flows.plan import Stage, plan
from flows.power import check_decision_power
from flows.spec import Spec, engine_api_key, load_spec
from gates.accuracy import PowerPlan, plan_power
from gates.policy import GatePolicy, load_policy, precision_class
from gates.rules import check_settings
from infra.checkpoint import (
    check_checkpoint,
    check_has_chat_template,
    check_same_chat_template,
    check_same_tokenizer,
)
from infra.cpu_support import check_cpu_servable, cpu_flags
from infra.errors import SpecError
from load.profile import LoadProfile, load_profile
from load.prompts import LoadPrompts, prepare


class Prepared:
    """Everything checked before any engine starts. `engine_host`: checked where the engines
    will run; elsewhere (a submission from a control host) a CUDA spec's placement is planned
    only when the GPUs are known (nvidia-smi, or the spec's gpu_memory_gib)."""

    def __init__(self, spec_path: Path, run_checks: bool = False,
                 engine_host: bool = True) -> None:
        """`run_checks`: also import and run a user eval set's own row checker (a run, which
        imports its code to score anyway); without it the set's code is only read."""
        self.spec_path = spec_path
        self.spec: Spec = load_spec(spec_path)
        self.api_key = engine_api_key(self.spec.engine)  # its clients send it; never stored
        self.stages: list[Stage] = plan(self.spec)
        self.pools: dict[str, int] = validate_sets(self.spec.evalsets, run_checks)
        check_chat_template(self.spec.evalsets, self.spec.chat_template)
        for stage in self.stages:
            if stage.structured_output:
                check_schema_items(stage.name, self.spec.evalsets)
        engine = self.spec.engine
        if engine.starts_server:
            fit_to_context(self.spec.evalsets, engine.max_model_len)  # no bucket fits: fail now
            for checkpoint in dict.fromkeys(stage.checkpoint for stage in self.stages):
                check_checkpoint(checkpoint)  # headers and tokenizer: a broken file fails now
            check_prompts_fit(self.spec.evalsets, engine.max_model_len,
                              self.spec.baseline.checkpoint / "tokenizer.json")
            if engine.serving_device() == "cpu":
                flags = cpu_flags()
                for stage in self.stages:
                    axes = stage.axes
                    check_cpu_servable(stage.name, axes.weights, axes.activations, axes.kv_cache,
                                       axes.emulated, flags)
        for stage in self.stages[1:]:  # as the chat template: found now, not after both ran
            check_same_tokenizer(stage.name, stage.checkpoint, self.spec.baseline.checkpoint)
        if self.spec.chat_template:  # the comparability gate would find it after both stages ran
            check_has_chat_template(self.spec.baseline.checkpoint)  # each stage must match it
            for stage in self.stages[1:]:
                check_same_chat_template(stage.name, stage.checkpoint, self.spec.baseline.checkpoint)
        base = spec_path.resolve().parent
        profile = self.spec.load_profile
        if profile.endswith((".yaml", ".yml")) and not Path(profile).is_absolute():
            profile = str(base / profile)
        self.profile: LoadProfile = load_profile(profile)
        self.profile.check_fits(getattr(engine, "max_model_len", None), profile)
        # Where each CUDA engine goes, and that they fit, before any starts (None off CUDA).
        self.placement = plan_run_placement(self.spec, self.stages, kv_tokens_needed(
            self.profile, getattr(engine, "max_model_len", None)), required=engine_host)
        # Replayed load prompts are read and tokenized now: a bad prompt file fails before any engine.
        self.load_prompts: LoadPrompts | None = prepare(self.profile, self.spec.baseline.checkpoint)
        self.policy: GatePolicy = load_policy(self.spec.gate_policy, base)
        self.policy.check_min_items(self.pools, self.spec.gate_policy)
        check_settings(self.policy, f"gate policy {self.spec.gate_policy}")  # plug-in rules
        self.power = check_power(self.spec, self.stages, self.pools, self.policy)
        self.decision_power = check_decision_power(self.spec, self.stages, self.pools, self.policy)


def check_power(spec: Spec, stages: list[Stage], pools: dict[str, int],
                policy: GatePolicy) -> list[PowerPlan]:
    """Refuse a spec whose sets cannot give the pooled accuracy test the policy's power."""
    sizes = {s.name: s.first_look(pools[s.name]) for s in spec.evalsets}
    classes = sorted({precision_class(s.axes.model_dump(exclude={"emulated"}))
                      for s in stages if s.parent is not None})
    samples = {s.name: s.sampling.samples for s in spec.evalsets if s.sampling}
    plans = [plan_power(sizes, pools, precision, policy, samples) for precision in classes]
    for power in plans:
        if power.power < policy.quality.power:
            hint = (f"use at least: {', '.join(f'{n} limit {k}' for n, k in power.needed.items())}"
                    if power.needed else "the sets do not hold enough items: add items, or widen "
                    "the margin in the gate policy")
            raise SpecError("eval sets too small for the accuracy gate: "
                            f"{power.describe(policy.quality.power)}; {hint}")
    return plans


_CHECKED: dict[str, Prepared] = {}


def checked(spec_path: Path) -> Prepared:
    """Check a spec before Prefect starts; the flow then reuses it instead of checking again."""
    prepared = Prepared(spec_path, run_checks=True)
    _CHECKED[str(spec_path.resolve())] = prepared
    return prepared


def take_checked(spec_path: Path) -> Prepared:
    """The spec `checked` checked before Prefect started, else checked now (a deployment's run)."""
    return _CHECKED.pop(str(spec_path.resolve()), None) or Prepared(spec_path, run_checks=True)
