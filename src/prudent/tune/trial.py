"""Inside a trial's training process: report each logged objective to the study, prune on cue.

The tuner launches the user's unchanged script with the trial in its launch spec; the
component below is then plugged in by default (``components.py``), so every ``run.log(...)``
carrying the objective becomes ``trial.report(value, step=epochs_done)``, and when the
pruner says so the run stops as ``pruned`` (exit code 5) through ``StopRun``. Under the tuner
the ``non_finite`` and ``divergence`` rules prune instead of stop, so a sick trial ends at
once, before the pruner would see it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from prudent.events import Component
from prudent.launch import ENV_TUNE_TRIAL, LaunchSpec, TrialSpec
from prudent.stop import StopReason

if TYPE_CHECKING:
    from prudent.context import RunContext
    from prudent.monitor.settings import MonitorSettings

__all__ = ["ENV_TRIAL", "SICK_RULES", "TrialReporter", "trial_env", "trial_from_env",
           "under_tuner"]

ENV_TRIAL = ENV_TUNE_TRIAL
SICK_RULES = ("non_finite", "divergence")


def trial_env(*, storage: str, study: str, trial_id: int, number: int, objective: str,
              pruner: Mapping[str, Any]) -> dict[str, str]:
    """The variables a trial's process needs (set by the tuner, read by :func:`trial_from_env`)."""
    trial = TrialSpec(storage, study, trial_id, number, objective, dict(pruner))
    return LaunchSpec(trial=trial).to_env()


def trial_from_env(environ: Mapping[str, str] | None = None) -> TrialReporter | None:
    """The component, when this process is a trial of ``prudent tune``; else None."""
    trial = LaunchSpec.from_env(environ).trial
    if trial is None:
        return None
    return TrialReporter(trial.storage, trial.study, trial.trial_id, trial.number,
                         trial.objective, trial.pruner)


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

    The step is the number of epochs done (1 after the first epoch), so pruner rungs read as
    epochs. A resumed trial does not report an epoch twice.
    """

    name = "tune_trial"
    main_rank_only = True

    def __init__(self, storage: str, study: str, trial_id: int, number: int, objective: str,
                 pruner: Mapping[str, Any]) -> None:
        self.storage_url, self.study_name = storage, study
        self.trial_id, self.number, self.objective = trial_id, number, objective
        self.pruner_spec = dict(pruner)
        self._trial: Any = None
        self._reported: set[int] = set()  # epochs reported, before an interruption too

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
        self._reported = set(storage.get_trial(self.trial_id).intermediate_values)

    def on_log(self, run: RunContext, metrics: dict[str, float]) -> None:
        value = metrics.get(self.objective)
        if self._trial is None or self.objective not in metrics or value is None:
            return
        step = run.state.epoch + 1
        if not math.isfinite(value):
            run.request_stop(StopReason.pruned(
                f"pruner: {self.objective} is {value} at epoch {step}"))
            return
        if step in self._reported:
            return  # resumed: this epoch was reported before the interruption
        self._trial.report(value, step=step)
        self._reported.add(step)
        if self._trial.should_prune():
            run.request_stop(StopReason.pruned(
                f"pruner {self.pruner_spec.get('name')}: {self.objective}={value:.6g} at epoch "
                f"{step} is not among the best trials at that epoch (trial {self.number})"))
