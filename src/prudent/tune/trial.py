"""Inside a trial's training process: report each logged objective to the study, prune on cue.

The tuner launches the user's unchanged script with the trial in its launch spec; the
component below is then plugged in by default (``wiring/components.py``), so every ``run.log(...)``
carrying the objective becomes ``trial.report(value, step=...)``: at the number of epochs done
in a loop with ``run.epochs``, at the optimizer step of the ``run.log`` in an iteration loop
(nanoGPT's ``for it in range(max_iters)``), so the pruner sees every evaluation. When the
pruner says so the run stops as ``pruned`` (exit code 5) through ``StopRun``. Under the tuner
the ``non_finite`` and ``divergence`` rules prune instead of stop, so a sick trial ends at
once, before the pruner would see it. With a step budget (``prudent tune --max-steps N``) the
trial stops with reason ``budget`` after N optimizer steps, and its worker counts it complete.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from prudent.kernel.events import Component
from prudent.kernel.stop import StopKind, StopReason
from prudent.launch.spec import ENV_TUNE_TRIAL, LaunchSpec, TrialSpec

if TYPE_CHECKING:
    from prudent.kernel.context import RunContext
    from prudent.monitor.settings import MonitorSettings

__all__ = ["ENV_TRIAL", "SICK_RULES", "UNIT_ATTR", "TrialReporter", "TrialStepBudget",
           "trial_env", "trial_from_env", "under_tuner"]

ENV_TRIAL = ENV_TUNE_TRIAL
SICK_RULES = ("non_finite", "divergence")
UNIT_ATTR = "unit"  # the trial's user attribute: "epoch" or "step", what its reports count


def trial_env(*, storage: str, study: str, trial_id: int, number: int, objective: str,
              pruner: Mapping[str, Any], max_steps: int | None = None) -> dict[str, str]:
    """The variables a trial's process needs (set by the tuner, read by :func:`trial_from_env`)."""
    trial = TrialSpec(storage, study, trial_id, number, objective, dict(pruner), max_steps)
    return LaunchSpec(trial=trial).to_env()


def trial_from_env(environ: Mapping[str, str] | None = None) -> TrialReporter | None:
    """The component, when this process is a trial of ``prudent tune``; else None."""
    trial = LaunchSpec.from_env(environ).trial
    if trial is None:
        return None
    args = (trial.storage, trial.study, trial.trial_id, trial.number, trial.objective,
            trial.pruner)
    if trial.max_steps is None:
        return TrialReporter(*args)
    return TrialStepBudget(*args, max_steps=trial.max_steps)


def under_tuner(settings: MonitorSettings, environ: Mapping[str, str] | None = None
                ) -> MonitorSettings:
    """In a trial, the sick-run rules prune (exit 5, never resumed) where they would stop."""
    if LaunchSpec.from_env(environ).trial is None:
        return settings
    rules = settings.rules
    changed = {}
    for name in SICK_RULES:
        rule = getattr(rules, name, None)
        if rule is not None and "stop" in rule.action:
            actions = ["prune" if a == "stop" else a for a in rule.action]
            changed[name] = rule.model_copy(update={"action": actions})
    if not changed:
        return settings
    return settings.model_copy(update={"rules": rules.model_copy(update=changed)})


class TrialReporter(Component):
    """Reports the objective of each ``run.log`` to the trial; asks the pruner after each.

    The step is the number of epochs done (1 after the first epoch) when the loop goes
    through ``run.epochs``, so pruner rungs read as epochs; otherwise it is the optimizer
    step at which ``run.log`` was called (``run.state.step``), so rungs read as steps. The
    first report tells the trial which (user attribute ``unit``). A resumed trial does not
    report a step twice.
    """

    name = "tune_trial"
    main_rank_only = True

    def __init__(self, storage: str, study: str, trial_id: int, number: int, objective: str,
                 pruner: Mapping[str, Any]) -> None:
        self.storage_url, self.study_name = storage, study
        self.trial_id, self.number, self.objective = trial_id, number, objective
        self.pruner_spec = dict(pruner)
        self._trial: Any = None
        self._reported: set[int] = set()  # steps reported, before an interruption too
        self._unit: str | None = None  # told to the trial once

    def on_start(self, run: RunContext) -> None:
        import optuna

        from prudent.tune.strategy import make_pruner
        from prudent.tune.study import load, open_storage

        spec = self.pruner_spec
        pruner = make_pruner(spec.get("name", "none"), **spec.get("args", {}))
        storage = open_storage(self.storage_url)
        study = load(self.study_name, storage, sampler=optuna.samplers.RandomSampler(),
                     pruner=pruner)
        self._trial = optuna.trial.Trial(study, self.trial_id)
        frozen = storage.get_trial(self.trial_id)
        self._reported = set(frozen.intermediate_values)
        self._unit = frozen.user_attrs.get(UNIT_ATTR)

    def on_log(self, run: RunContext, metrics: dict[str, float]) -> None:
        value = metrics.get(self.objective)
        if self._trial is None or self.objective not in metrics or value is None:
            return
        unit, step = _report_step(run)
        if not math.isfinite(value):
            run.request_stop(StopReason.pruned(
                f"pruner: {self.objective} is {value} at {unit} {step}"))
            return
        if step in self._reported:
            return  # resumed: this step was reported before the interruption
        if self._unit != unit:
            self._trial.set_user_attr(UNIT_ATTR, unit)
            self._unit = unit
        self._trial.report(value, step=step)
        self._reported.add(step)
        if self._trial.should_prune():
            run.request_stop(StopReason.pruned(
                f"pruner {self.pruner_spec.get('name')}: {self.objective}={value:.6g} at {unit} "
                f"{step} is not among the best trials at that {unit} (trial {self.number})"))


class TrialStepBudget(TrialReporter):
    """A trial with a step budget (``prudent tune --max-steps N``): after N optimizer steps
    the run stops cleanly with reason ``budget`` (checkpoint written, exit code 4), and the
    worker counts the trial complete with the last objective it logged.

    A subclass rather than a second component, so that only a budgeted trial pays for an
    ``on_step_end`` handler (one comparison a step).
    """

    def __init__(self, *args: Any, max_steps: int) -> None:
        super().__init__(*args)
        if max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}")
        self.max_steps = max_steps

    def on_step_end(self, run: RunContext, metrics: dict[str, Any]) -> None:
        if run.state.step >= self.max_steps:
            run.request_stop(StopReason(StopKind.BUDGET, None, (
                f"step budget reached: {run.state.step} optimizer steps (prudent tune "
                f"--max-steps {self.max_steps}); the trial counts as complete")))


def _report_step(run: RunContext) -> tuple[str, int]:
    """(unit, step) of a report now: epochs done in an epoch loop, else the optimizer step."""
    state = run.state
    if state.num_epochs is not None:
        return "epoch", state.epoch + 1
    return "step", state.step
