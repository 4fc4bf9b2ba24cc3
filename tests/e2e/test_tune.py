"""``prudent tune`` end to end: real studies of a real script in real worker processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.e2e.conftest import Project, script

SPACE = """
lr:        {type: float, low: 1.0e-4, high: 1.0e3, log: true}
hidden:    {type: int, low: 4, high: 64, log: true}
optimizer: {type: categorical, choices: [adam, sgd]}
momentum:  {type: float, low: 0.5, high: 0.99, when: {optimizer: sgd}}
"""
SICK = '{"lr": 1000, "optimizer": "sgd", "momentum": 0.9}'  # SGD at lr 1e3: NaN within an epoch
GOOD = '{"lr": 0.05, "hidden": 32, "optimizer": "adam"}'
WEAK = '{"lr": 0.0001, "hidden": 4, "optimizer": "sgd", "momentum": 0.5}'  # barely learns
STEPS_PER_EPOCH = 16  # tune_train.py: 512 samples in batches of 32


def _tune(project: Project, *flags: str, space: str = SPACE, study: str = "s",
          timeout: float = 240) -> subprocess.CompletedProcess[str]:
    (project.path / "space.yaml").write_text(space)
    return project.prudent("tune", "--space", "space.yaml", "--objective", "val_acc",
                           "--study", study, *flags, "--", sys.executable, script("tune_train.py"),
                           timeout=timeout)


def _study(project: Project, name: str = "s") -> dict[str, Any]:
    result = project.prudent("study", name, "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_two_workers_prune_a_sick_trial_by_rule_and_a_weak_one_by_the_pruner(
        project: Project) -> None:
    result = _tune(project, "--trials", "3", "--workers", "2", "--pruner", "asha",
                   "--max-epochs", "4", "--enqueue", SICK, "--enqueue", GOOD, "--enqueue", WEAK)
    assert result.returncode == 0, result.stderr
    assert "projected: 3 trials x 1.8 epochs (pruner schedule, max 4)" in result.stderr
    summary = _study(project)
    trials = {t["number"]: t for t in summary["trials"]}
    assert [trials[n]["state"] for n in range(3)] == ["pruned", "complete", "pruned"], trials
    assert trials[0]["pruned_by"] in ("rule:non_finite", "rule:divergence")
    assert trials[2]["pruned_by"] == "pruner" and trials[2]["epochs"] < 4
    assert trials[1]["epochs"] == 4 and trials[1]["value"] == summary["best_value"]
    assert summary["best_params"] == json.loads(GOOD)
    assert summary["epochs_without_pruning"] == 12 and summary["epochs_total"] < 12
    for t in trials.values():  # each trial is a supervised run, linked by its id
        run = project.show(t["run_id"])
        assert run["status"] in ("completed", "stopped") and run["config"]["lr"] == t["params"]["lr"]
        assert t["cost_usd"] == run["cost_usd"]
    assert "best: val_acc=" in result.stdout
    folder = project.path / ".prudent" / "studies" / "s"
    assert (folder / "history.png").is_file() and (folder / "intermediate.png").is_file()


@pytest.mark.parametrize(("space", "message"), [
    ("lr: {type: real, low: 0.1, high: 1}", "parameter 'lr': unknown type 'real'"),
    ("lr: {type: float, low: 1.0, high: 0.1}", "parameter 'lr': low=1.0 > high=0.1"),
    ("optimizer: {type: categorical, choices: []}",
     "parameter 'optimizer': choices must be a non-empty list"),
])
def test_a_bad_space_is_refused_before_anything_runs(project: Project, space: str,
                                                     message: str) -> None:
    result = _tune(project, "--trials", "2", space=space)
    assert result.returncode == 2
    assert result.stderr.startswith("prudent: error: space.yaml: ") and message in result.stderr
    assert not (project.path / ".prudent").exists()  # no study, no run, nothing written


def test_an_objective_the_script_never_logs_stops_the_study_after_its_first_trial(
        project: Project) -> None:
    # a space where every trial learns: with the wide one, three sampled lrs that all diverge
    # (about one study in ten) are all pruned by a rule and never had to log the objective
    result = _tune(project, "--trials", "3", "--objective", "val_accuracy", "--pruner", "none",
                   space="lr: {type: float, low: 0.01, high: 0.1, log: true}")
    assert result.returncode == 2, result.stderr
    summary = _study(project)  # still readable; the trial is marked failed, nothing running
    states = [t["state"] for t in summary["trials"]]
    assert states == ["failed"], states  # the first trial that completes stops the study
    assert ("--objective 'val_accuracy' was never logged by trial 0" in result.stderr
            and "it logged: loss, val_acc" in result.stderr), result.stderr


def test_a_trial_whose_value_the_script_never_reads_fails_instead_of_being_scored(
        project: Project) -> None:
    # tune_train.py reads momentum only for SGD: a space without `when` hands it to Adam too
    space = ("optimizer: {type: categorical, choices: [adam, sgd]}\n"
             "momentum: {type: float, low: 0.5, high: 0.99}\n")
    result = _tune(project, "--trials", "2", "--pruner", "none", "--set", "epochs=2",
                   "--enqueue", '{"optimizer": "sgd", "momentum": 0.9}',
                   "--enqueue", '{"optimizer": "adam", "momentum": 0.9}', space=space)
    assert result.returncode == 0, result.stderr
    message = ("momentum=0.9 was not read from run.config by the end of epoch 1 (trial 1 of "
               "prudent tune): the trial fails rather than be scored on the script's own value. "
               'Read it from run.config (run.config["momentum"])')
    assert "warning: " + message in result.stderr
    trials = {t["number"]: t for t in _study(project)["trials"]}
    assert trials[0]["state"] == "complete" and trials[0]["epochs"] == 2
    assert trials[1]["state"] == "failed" and trials[1]["error"].startswith(message)
    run = project.show(trials[1]["run_id"])
    assert (run["stop_reason"], run["step"]) == ("error", STEPS_PER_EPOCH)  # one epoch, no more


def test_more_workers_than_the_policy_allows_is_refused(project: Project) -> None:
    (project.path / "policy.yaml").write_text("max_parallel_trials: 1\n")
    result = _tune(project, "--workers", "2", "--policy", "policy.yaml")
    assert result.returncode == 6
    assert "[max_parallel_trials] 2 parallel trials exceed policy" in result.stderr
    assert not (project.path / ".prudent" / "studies").exists()


def test_no_trial_starts_when_the_projected_trial_cost_would_pass_the_budget(
        project: Project) -> None:
    # 4 epochs x 1800 s at aws:g5.xlarge's $1.006/h: ~$2.01 a trial, over a $1.50 budget
    result = _tune(project, "--trials", "3", "--pruner", "none", "--max-epochs", "4",
                   "--epoch-s", "1800", "--instance", "aws:g5.xlarge", "--budget-usd", "1.50")
    assert result.returncode == 0, result.stderr
    assert "projected: 3 trials x 4.0 epochs (pruner schedule, max 4) = 12 epochs" in result.stderr
    assert "$6.036 (each trial's run is metered separately)" in result.stderr
    assert "would pass --budget-usd 1.50; no new trial starts" in result.stderr
    assert _study(project)["trials"] == []


@pytest.mark.slow
def test_a_study_in_a_database_url_storage(project: Project) -> None:
    """What several machines would share (PostgreSQL there; SQLite's URL here, one worker)."""
    url = f"sqlite:///{project.path / 'optuna.db'}"
    # two known-good configurations: a random lr up to 1e3 could be pruned by a rule
    result = _tune(project, "--trials", "2", "--pruner", "none", "--storage", url,
                   "--enqueue", GOOD, "--enqueue", GOOD.replace("0.05", "0.02"))
    assert result.returncode == 0, result.stderr
    assert not (project.path / ".prudent" / "studies" / "s.journal").exists()
    shown = project.prudent("study", "s", "--storage", url, "--json")
    assert shown.returncode == 0, shown.stderr
    assert [t["state"] for t in json.loads(shown.stdout)["trials"]] == ["complete", "complete"]


@pytest.mark.slow
def test_a_killed_study_restarts_and_completes_with_no_trial_lost_or_run_twice(
        project: Project) -> None:
    """SIGKILL the whole `prudent tune` mid-trial; the same command continues the study."""
    trials = 5
    space = SPACE + "epoch_sleep_s: {type: categorical, choices: [0.4]}\n"
    (project.path / "space.yaml").write_text(space)
    args = [sys.executable, "-m", "prudent", "tune", "--space", "space.yaml", "--objective",
            "val_acc", "--study", "k", "--trials", str(trials), "--workers", "2", "--pruner",
            "asha", "--max-epochs", "4", "--seed", "3", "--instance", "aws:g5.xlarge",
            "--enqueue", SICK, "--enqueue", GOOD, "--", sys.executable, script("tune_train.py")]
    first = subprocess.Popen(args, cwd=project.path, env=project.env, start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_a_trial_mid_training(project.path / ".prudent" / "studies" / "k.journal")
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.communicate(timeout=30)
    interrupted = _running_trials(project.path / ".prudent" / "studies" / "k.journal",
                                  with_epochs=True)
    assert interrupted, "the kill should have caught a trial mid-training"

    second = project.prudent(*args[3:], timeout=300)
    assert second.returncode == 0, second.stderr
    summary = _study(project, "k")
    numbers = [t["number"] for t in summary["trials"]]
    assert numbers == list(range(trials))  # none lost, none added
    assert all(t["state"] in ("complete", "pruned") for t in summary["trials"]), summary["trials"]
    run_ids = [t["run_id"] for t in summary["trials"]]
    assert len(set(run_ids)) == trials
    for number in interrupted:  # resumed under the same run id, from its checkpoint
        t = summary["trials"][number]
        run = project.show(t["run_id"])
        assert run["restarts"] >= 1 and f"trial {number} was interrupted" in second.stderr
        names = [e["name"] for e in run["events"] if e["kind"] == "checkpoint"]
        assert "resumed" in names, names
    for t in summary["trials"]:  # no step trained twice: a full trial has exactly 4 epochs of steps
        run = project.show(t["run_id"])
        limit = 4 * STEPS_PER_EPOCH
        assert run["step"] == limit if t["state"] == "complete" else run["step"] <= limit
    by = {t["pruned_by"] for t in summary["trials"] if t["state"] == "pruned"}
    assert "pruner" in by and by & {"rule:non_finite", "rule:divergence"}, summary["trials"]
    assert summary["cost_usd_total"] > 0
    assert not _training_processes(project.path)  # no zombies or orphans left behind


def _wait_for_a_trial_mid_training(journal: Path, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if journal.exists() and _running_trials(journal, with_epochs=True):
            return
        time.sleep(0.3)
    raise AssertionError("no trial reached its first epoch in time")


def _running_trials(journal: Path, with_epochs: bool = False) -> list[int]:
    import optuna
    from optuna.storages.journal import JournalFileBackend

    storage = optuna.storages.JournalStorage(JournalFileBackend(str(journal)))
    try:
        study = optuna.load_study(study_name="k", storage=storage)
    except KeyError:
        return []
    return [t.number for t in study.get_trials(states=(optuna.trial.TrialState.RUNNING,))
            if t.intermediate_values or not with_epochs]


def _training_processes(folder: Path) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter(["cmdline", "cwd"]):
        cmdline = " ".join(process.info["cmdline"] or [])
        if "tune_train.py" in cmdline and process.info["cwd"] == str(folder):
            found.append(process)
    return found
