"""The study summary counts in what the trials reported at: epochs, or steps."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from prudent.tune.report import print_summary, reported_unit, summarize
from prudent.tune.study import create_or_load, open_storage, storage_url
from prudent.tune.trial import UNIT_ATTR

META = {"objective": "val_loss", "direction": "min", "space": {}, "max_steps": 120,
        "pruner": {"name": "asha"}}


def _trial(study: optuna.Study, values: dict[int, float], unit: str, *, steps: int,
           pruned: bool = False) -> None:
    trial = study.ask()
    for step, value in values.items():
        trial.report(value, step)
    trial.set_user_attr(UNIT_ATTR, unit)
    trial.set_user_attr("steps", steps)
    trial.set_user_attr("epochs", 0 if unit == "step" else max(values))
    trial.set_user_attr("cost_usd", 0.0)
    if pruned:
        study.tell(trial, state=optuna.trial.TrialState.PRUNED)
    else:
        study.tell(trial, values[max(values)])


def test_a_study_of_iteration_loops_counts_steps(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    study = create_or_load("s", open_storage(storage_url(tmp_path, "s")), META)
    _trial(study, {0: 3.1, 40: 2.0, 80: 1.7, 120: 1.5}, "step", steps=120)
    _trial(study, {0: 3.1, 40: 2.6, 80: 2.4}, "step", steps=81, pruned=True)
    assert reported_unit(study) == "step"
    summary = summarize(study)
    assert summary["unit"] == "step"
    assert [(t["steps"], t["reported"]) for t in summary["trials"]] == [(120, 4), (81, 3)]
    assert summary["steps_total"] == 201 and summary["steps_without_pruning"] == 240
    print_summary(summary)
    out = capsys.readouterr().out
    assert "steps used 201 (240 if none had been pruned)" in out and "epochs" not in out


def test_a_study_of_epoch_loops_still_counts_epochs(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    study = create_or_load("e", open_storage(storage_url(tmp_path, "e")),
                           {**META, "max_steps": None, "max_epochs": 3})
    _trial(study, {1: 0.5, 2: 0.4, 3: 0.3}, "epoch", steps=48)
    summary = summarize(study)
    assert summary["unit"] == "epoch" and summary["trials"][0]["epochs"] == 3
    print_summary(summary)
    assert "epochs used 3 (3 if none had been pruned)" in capsys.readouterr().out
