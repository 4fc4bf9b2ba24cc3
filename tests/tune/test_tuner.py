from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from prudent.kernel.errors import ConfigError
from prudent.tune.study import create_or_load, open_storage, storage_url
from prudent.tune.tuner import TuneOptions, Tuner, parse_enqueue
from prudent.wiring.config import ProjectSettings

SPACE = {"lr": {"type": "float", "low": 0.001, "high": 0.1, "log": True},
         "opt": {"type": "categorical", "choices": ["adam", "sgd"]}}


def _options(**kwargs: object) -> TuneOptions:
    base = {"command": ["python", "train.py"], "space": SPACE, "objective": "val_acc"}
    return TuneOptions(**{**base, **kwargs})  # type: ignore[arg-type]


def test_warm_start_enqueues_the_best_configurations_of_an_earlier_study_that_fit(
        settings: ProjectSettings) -> None:
    home = Path(settings.store.home).resolve()
    old = create_or_load("old", open_storage(storage_url(home, "old")),
                         {"objective": "val_acc", "direction": "max", "space": {}})
    distributions = {"lr": optuna.distributions.FloatDistribution(0.001, 1.0, log=True),
                     "opt": optuna.distributions.CategoricalDistribution(["adam", "sgd"])}
    for value, params in ((0.9, {"lr": 0.01, "opt": "adam"}), (0.5, {"lr": 0.05, "opt": "sgd"}),
                          (0.95, {"lr": 0.5, "opt": "sgd"})):  # lr 0.5 is outside the new space
        old.add_trial(optuna.trial.create_trial(params=params, distributions=distributions,
                                                value=value))
    study, _ = Tuner(_options(study="new", warm_start="old"), settings, quiet=True).open()
    waiting = [t.system_attrs["fixed_params"] for t in study.get_trials()
               if t.state.name == "WAITING"]
    assert waiting == [{"opt": "sgd"}, {"lr": 0.01, "opt": "adam"}, {"lr": 0.05, "opt": "sgd"}]
    again, _ = Tuner(_options(study="new", warm_start="old"), settings, quiet=True).open()
    assert len(again.get_trials()) == 3  # a restart does not enqueue them twice


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"command": []}, "no command to tune"),
    ({"direction": "up"}, "--direction must be max or min"),
    ({"sampler": "bayes"}, "--sampler 'bayes'"),
    ({"workers": 0}, "--workers must be >= 1"),
    ({"budget_usd": -1.0}, "--budget-usd must be > 0"),
    ({"enqueue": [{"lrr": 0.1}]}, "--enqueue #1: lrr not in the search space"),
    ({"study": "../x"}, "study name '../x' is invalid"),
    ({"warm_start": "missing"}, "--warm-start 'missing': no such study"),
])
def test_bad_flags_are_refused_before_a_study_opens(settings: ProjectSettings, kwargs: dict,
                                                    message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(".", r"\.")):
        Tuner(_options(**kwargs), settings, quiet=True).open()


def test_enqueue_takes_inline_json_and_files_of_lists(tmp_path: Path) -> None:
    path = tmp_path / "good.yaml"
    path.write_text("- {lr: 0.01}\n- {lr: 0.02, opt: sgd}\n")
    assert parse_enqueue(['{"lr": 0.03}', str(path)]) == [
        {"lr": 0.03}, {"lr": 0.01}, {"lr": 0.02, "opt": "sgd"}]
    with pytest.raises(ConfigError, match="expected a mapping"):
        parse_enqueue(["[1, 2]"])


def test_a_set_key_the_space_also_samples_is_refused_naming_both(settings: ProjectSettings) -> None:
    with pytest.raises(ConfigError, match=r"--set lr=0\.01 fixes 'lr', which the search space "
                                          r"also searches: keep 'lr' in one of them"):
        Tuner(_options(fixed={"lr": 0.01, "max_iters": 100}), settings, quiet=True)


def test_set_values_and_the_step_budget_are_kept_in_the_study_definition(
        settings: ProjectSettings) -> None:
    from prudent.tune.study import meta_of

    options = _options(study="fixed", fixed={"max_iters": 120}, max_steps=90)
    study, _ = Tuner(options, settings, quiet=True).open()
    meta = meta_of(study)
    assert meta["fixed"] == {"max_iters": 120} and meta["max_steps"] == 90


@pytest.mark.parametrize(("kwargs", "args"), [
    ({"pruner": "asha"}, {}),
    ({"pruner": "asha", "min_resource": 40}, {"min_resource": 40}),
    ({"pruner": "hyperband", "max_steps": 300}, {"max_resource": 300}),
    ({"pruner": "hyperband", "max_epochs": 9, "max_steps": 300}, {"max_resource": 9}),
    ({"pruner": "none", "min_resource": 40}, {}),
])
def test_the_pruner_resource_comes_from_the_epoch_or_step_flags(kwargs: dict, args: dict) -> None:
    assert _options(**kwargs).pruner_spec()["args"] == args


def test_a_step_budget_projects_the_study_in_steps(settings: ProjectSettings) -> None:
    tuner = Tuner(_options(study="steps", trials=4, pruner="asha", max_steps=120,
                           min_resource=40), settings, quiet=True)
    study, _ = tuner.open()
    lines = tuner._projection(study).lines()
    assert lines[0].startswith("projected: 4 trials x ") and "steps (pruner schedule, max 120)" \
        in lines[0]
    assert "until a step is measured" in lines[1] and "--epoch-s" not in lines[1]


@pytest.mark.parametrize(("workers", "environ", "expected"), [
    (1, {}, "all"), (2, {}, "half"), (64, {}, 1), (2, {"OMP_NUM_THREADS": "3"}, None)])
def test_trials_get_threads_that_fit_the_cores_unless_the_user_chose(
        settings: ProjectSettings, capsys: pytest.CaptureFixture[str], workers: int,
        environ: dict[str, str], expected: object) -> None:
    import os

    cores = len(os.sched_getaffinity(0))
    want = {"all": cores, "half": max(1, cores // 2)}.get(expected, expected)  # type: ignore[arg-type]
    tuner = Tuner(_options(workers=workers), settings)
    assert tuner._threads(environ) == want
    note = capsys.readouterr().err
    if want is None:
        assert note == ""
    else:
        assert (f"each trial runs with OMP_NUM_THREADS={want} ({cores} cores / {workers} "
                "worker(s)); set OMP_NUM_THREADS to choose") in note
