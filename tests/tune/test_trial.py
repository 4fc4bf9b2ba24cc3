from __future__ import annotations

from pathlib import Path

import optuna
import pytest

import prudent
from prudent.tune.strategy import make_pruner
from prudent.tune.study import create_or_load, open_storage, storage_url
from prudent.tune.trial import (
    ENV_TRIAL,
    UNIT_ATTR,
    TrialReporter,
    TrialStepBudget,
    trial_env,
    trial_from_env,
    under_tuner,
)
from prudent.wiring.config import ProjectSettings

META = {"objective": "val_acc", "direction": "max", "space": {}, "pruner": {"name": "asha"}}
ASHA = {"name": "asha", "args": {}}


def _study(tmp_path: Path) -> tuple[str, optuna.Study]:
    url = storage_url(tmp_path / "studies-home", "st")
    return url, create_or_load("st", open_storage(url), META, pruner=make_pruner("asha"))


def _id(url: str, trial: optuna.trial.Trial) -> int:
    """The trial's storage id, through the storage's public API (as the tune worker does)."""
    storage = open_storage(url)
    return storage.get_trial_id_from_study_id_trial_number(
        storage.get_study_id_from_name("st"), trial.number)


def _finished(study: optuna.Study, values: dict[int, float]) -> None:
    trial = study.ask()
    for step, value in values.items():
        trial.report(value, step)
        assert not trial.should_prune()  # the pruner records the rungs this trial reached
    study.tell(trial, values[max(values)])


def _train(settings: ProjectSettings, reporter: TrialReporter, values: list[float]) -> prudent.Run:
    run = prudent.init(name="trial", config={}, exit_on_stop=False, settings=settings,
                       components=[reporter])
    with run:
        for epoch in run.epochs(len(values)):
            run.log(val_acc=values[epoch], other=1.0)
    return run


def _iterate(settings: ProjectSettings, reporter: TrialReporter, values: dict[int, float],
             num_steps: int) -> prudent.Run:
    """A nanoGPT-style loop: no run.epochs, an evaluation at the iterations in ``values``."""
    run = prudent.init(name="trial", config={}, exit_on_stop=False, settings=settings,
                       components=[reporter])
    with run:
        for it in range(run.state.step, num_steps):
            if it in values:
                run.log(val_acc=values[it])
            run.step(loss=1.0)
    return run


def test_an_iteration_loop_reports_at_the_step_of_each_evaluation(
        settings: ProjectSettings, tmp_path: Path) -> None:
    url, study = _study(tmp_path)
    trial = study.ask()
    reporter = TrialReporter(url, "st", _id(url, trial), trial.number, "val_acc", ASHA)
    run = _iterate(settings, reporter, {0: 0.1, 10: 0.5, 20: 0.7, 30: 0.8}, 31)
    assert run.status == "completed"
    frozen = study.trials[trial.number]
    assert frozen.intermediate_values == {0: 0.1, 10: 0.5, 20: 0.7, 30: 0.8}  # not all "epoch 1"
    assert frozen.user_attrs[UNIT_ATTR] == "step"


def test_an_epoch_loop_still_reports_at_epochs_done(settings: ProjectSettings,
                                                    tmp_path: Path) -> None:
    url, study = _study(tmp_path)
    trial = study.ask()
    run = prudent.init(name="trial", config={}, exit_on_stop=False, settings=settings,
                       components=[TrialReporter(url, "st", _id(url, trial), trial.number,
                                                 "val_acc", ASHA)])
    with run:
        for epoch in run.epochs(2):
            for _ in range(5):
                run.step(loss=1.0)  # 5 steps an epoch: reports stay at 1, 2, not 5, 10
            run.log(val_acc=0.5 + epoch / 10)
    frozen = study.trials[trial.number]
    assert frozen.intermediate_values == {1: 0.5, 2: 0.6}
    assert frozen.user_attrs[UNIT_ATTR] == "epoch"


def test_an_iteration_loop_is_pruned_at_its_step_with_the_step_in_the_message(
        settings: ProjectSettings, tmp_path: Path) -> None:
    url, study = _study(tmp_path)
    _finished(study, {0: 0.1, 10: 0.9, 20: 0.95})
    trial = study.ask()
    reporter = TrialReporter(url, "st", _id(url, trial), trial.number, "val_acc", ASHA)
    run = _iterate(settings, reporter, {0: 0.1, 10: 0.3, 20: 0.4}, 21)
    assert run.stop_reason == "pruned" and run.state.step == 10
    assert study.trials[trial.number].intermediate_values == {0: 0.1, 10: 0.3}
    message = run.context.stop_reason.message
    assert "val_acc=0.3 at step 10 is not among the best trials at that step" in message


def test_a_resumed_iteration_loop_does_not_report_a_step_twice(settings: ProjectSettings,
                                                               tmp_path: Path) -> None:
    url, study = _study(tmp_path)
    trial = study.ask()
    trial.report(0.42, 10)  # reported before the interruption, which came before step 11
    run = _iterate(settings, TrialReporter(url, "st", _id(url, trial), trial.number, "val_acc",
                                           {"name": "none"}), {10: 0.9, 20: 0.95}, 21)
    assert run.status == "completed"
    assert study.trials[trial.number].intermediate_values == {10: 0.42, 20: 0.95}


def test_a_step_budget_stops_the_trial_after_its_steps_with_reason_budget(
        settings: ProjectSettings, tmp_path: Path) -> None:
    url, study = _study(tmp_path)
    trial = study.ask()
    reporter = TrialStepBudget(url, "st", _id(url, trial), trial.number, "val_acc",
                               {"name": "none"}, max_steps=25)
    run = _iterate(settings, reporter, {0: 0.1, 10: 0.5, 20: 0.7, 30: 0.8}, 100)
    assert run.stop_reason == "budget" and run.state.step == 25
    assert run.exit_code == prudent.ExitCode.BUDGET
    assert "--max-steps 25" in run.context.stop_reason.message
    assert study.trials[trial.number].intermediate_values == {0: 0.1, 10: 0.5, 20: 0.7}


def test_a_trial_worse_than_the_best_at_its_epoch_is_pruned_through_stop_run(
        settings: ProjectSettings, tmp_path: Path) -> None:
    url, study = _study(tmp_path)
    _finished(study, {1: 0.9, 2: 0.95, 3: 0.97})
    trial = study.ask()
    reporter = TrialReporter(url, "st", _id(url, trial), trial.number, "val_acc", ASHA)
    run = _train(settings, reporter, [0.5, 0.6, 0.7])
    assert run.stop_reason == "pruned" and run.exit_code == prudent.ExitCode.PRUNED
    frozen = study.trials[trial.number]
    assert frozen.intermediate_values == {1: 0.5}  # step = epochs done; stopped after epoch 1
    assert run.context.store is not None


def test_a_good_trial_reports_every_epoch_and_completes(settings: ProjectSettings,
                                                         tmp_path: Path) -> None:
    url, study = _study(tmp_path)
    _finished(study, {1: 0.5, 2: 0.6, 3: 0.7})
    trial = study.ask()
    run = _train(settings, TrialReporter(url, "st", _id(url, trial), trial.number, "val_acc",
                                         ASHA), [0.8, 0.9, 0.95])
    assert run.status == "completed"
    assert study.trials[trial.number].intermediate_values == {1: 0.8, 2: 0.9, 3: 0.95}


def test_a_resumed_trial_does_not_report_an_epoch_twice(settings: ProjectSettings,
                                                        tmp_path: Path) -> None:
    url, study = _study(tmp_path)
    trial = study.ask()
    trial.report(0.42, 1)  # reported before the interruption
    run = _train(settings, TrialReporter(url, "st", _id(url, trial), trial.number, "val_acc",
                                         {"name": "none"}), [0.8, 0.9])
    assert run.status == "completed"  # and no Optuna "already reported" warning (= error here)
    assert study.trials[trial.number].intermediate_values == {1: 0.42, 2: 0.9}


def test_a_non_finite_objective_prunes_at_once(settings: ProjectSettings, tmp_path: Path) -> None:
    url, study = _study(tmp_path)
    trial = study.ask()
    run = _train(settings, TrialReporter(url, "st", _id(url, trial), trial.number, "val_acc",
                                         {"name": "none"}), [float("nan"), 0.9])
    assert run.stop_reason == "pruned"


def test_the_component_exists_only_in_a_trial_process(tmp_path: Path) -> None:
    assert trial_from_env({}) is None
    env = trial_env(storage="s.journal", study="st", trial_id=3, number=2, objective="val_acc",
                    pruner=ASHA)
    reporter = trial_from_env(env)
    assert reporter is not None and (reporter.trial_id, reporter.number) == (3, 2)
    assert type(reporter) is TrialReporter  # no per-step handler without a step budget
    budgeted = trial_from_env(trial_env(storage="s.journal", study="st", trial_id=3, number=2,
                                        objective="val_acc", pruner=ASHA, max_steps=300))
    assert isinstance(budgeted, TrialStepBudget) and budgeted.max_steps == 300


def test_under_the_tuner_sick_rules_prune_instead_of_stop(settings: ProjectSettings,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    assert under_tuner(settings.monitor) is settings.monitor
    monkeypatch.setenv(ENV_TRIAL, trial_env(storage="s.journal", study="st", trial_id=3,
                                            number=2, objective="val_acc", pruner=ASHA)[ENV_TRIAL])
    tuned = under_tuner(settings.monitor)
    assert tuned.rules.non_finite.action == ["prune"]
    assert tuned.rules.divergence.action == ["prune"]
    assert settings.monitor.rules.non_finite.action == ["stop"]  # the original is untouched
