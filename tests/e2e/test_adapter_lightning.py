"""prudent.lightning end to end: Lightning's own Trainer.fit in real processes, under real
`prudent run`, `tune` and `preflight` commands (tests/e2e/scripts/lightning_train.py)."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import time

import pytest
import torch

from tests.e2e.conftest import ROOT, Project, child_of, script
from tests.e2e.test_resume import assert_identical, attempts
from tests.mlflow_server import MLFLOW_ENV, mlflow_server  # noqa: F401 - the session's server

pytest.importorskip("lightning")

TRAIN = script("lightning_train.py")
STEPS = 69  # 3 epochs of 23 batches (1437 digits in batches of 64)


def _events(run: dict, *kinds: str) -> list[tuple[int, str, str]]:
    return [(e["step"], e["kind"], e["name"]) for e in run["events"] if e["kind"] in kinds]


def test_a_healthy_lightning_run_is_recorded_with_metrics_profile_and_cost(
        project: Project) -> None:
    result = project.prudent("run", "--run-id", "healthy", "--set", "max_epochs=1",
                             "--set", "lr=0.1", "--", sys.executable, TRAIN, timeout=240)
    assert result.returncode == 0, result.stderr
    assert "DONE 23" in result.stdout
    run = project.show("healthy")
    assert (run["status"], run["exit_code"], run["step"]) == ("completed", 0, 23)
    # --set reached the module's hparams; the module's own hyperparameters joined the config
    assert run["config"]["lr"] == 0.1 and run["config"]["nan_at_step"] == -1
    assert run["metrics"]["val_acc"] > 0.3 and "loss" in run["metrics"]
    assert run["profile"]["num_steps"] == 23 and run["profile"]["breakdown"]["compute"]["s"] > 0
    assert run["cost"]["attempts"] == 1
    assert [e for e in _events(run, "checkpoint") if e[2] == "saved"]
    profile = project.prudent("profile", "healthy")
    assert profile.returncode == 0 and "steps" in profile.stdout, profile.stderr


@pytest.mark.slow
def test_a_nan_batch_is_stopped_by_non_finite_with_exit_3_keeping_only_finite_checkpoints(
        project: Project) -> None:
    (project.path / "prudent.yaml").write_text("checkpoint: {every: 10steps}\n")
    result = project.prudent("run", "--run-id", "nan", "--set", "nan_at_step=25", "--",
                             sys.executable, TRAIN, timeout=240)
    assert result.returncode == 3, result.stderr
    assert "rule non_finite: loss is NaN at step 25" in result.stderr
    run = project.show("nan")
    assert (run["status"], run["stop_reason"], run["step"]) == ("stopped", "rule:non_finite", 25)
    saved = [step for step, _, name in _events(run, "checkpoint") if name == "saved"]
    assert saved and max(saved) < 25  # the last good checkpoint; the NaN weights never saved
    assert ("capture", "written") in [(k, n) for _, k, n in _events(run, "capture")]
    assert "DONE" not in result.stdout  # fit returned, the script did not go on


@pytest.mark.slow
def test_sigterm_mid_epoch_exits_75_and_the_relaunch_ends_with_identical_weights(
        project: Project) -> None:
    reference = project.prudent("run", "--run-id", "ref", "--set", "out=ref.pt", "--",
                                sys.executable, TRAIN, timeout=240)
    assert reference.returncode == 0, reference.stderr
    (project.path / "steps.log").unlink()
    supervisor = subprocess.Popen(
        [sys.executable, "-m", "prudent", "run", "--run-id", "victim", "--max-restarts", "1",
         "--restart-backoff-s", "0.1", "--set", "sleep_s=0.03", "--", sys.executable, TRAIN],
        cwd=project.path, env=project.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    child = child_of(supervisor, None)
    log = project.path / "steps.log"
    deadline = time.monotonic() + 120
    while not (log.exists() and len(log.read_text().splitlines()) >= 30):  # epoch 2 of 3
        assert supervisor.poll() is None and time.monotonic() < deadline, supervisor.stderr
        time.sleep(0.05)
    child.terminate()
    out, err = supervisor.communicate(timeout=240)
    assert supervisor.returncode == 0, err
    assert "relaunch 1 of 1 after exit code 75" in err and f"DONE {STEPS}" in out
    before, after = attempts(log)
    assert after[0] == before[-1] + 1 and after[-1] == STEPS  # no step redone, none skipped
    assert_identical(torch.load(project.path / "ref.pt", weights_only=True),
                     torch.load(project.path / "final.pt", weights_only=True))
    run = project.show("victim")
    assert (run["status"], run["restarts"], run["step"]) == ("completed", 1, STEPS)
    names = _events(run, "checkpoint", "lifecycle")
    assert (before[-1], "checkpoint", "saved") in names  # the stop saved at once
    assert any(name == "resumed" for _, _, name in names)


def test_a_vanished_machine_resumed_from_an_epochs_last_batch_trains_the_next_epoch(
        project: Project) -> None:
    # checkpoints after each epoch's last batch only (23 steps an epoch); the machine vanishes
    # in the third epoch, so the run resumes from step 46: the second epoch fully trained,
    # Lightning not yet past its end. The third epoch must be trained, in its own order.
    (project.path / "prudent.yaml").write_text(
        "checkpoint: {every: 23steps, at_epoch_end: false}\n")
    reference = project.prudent("run", "--run-id", "ref", "--set", "out=ref.pt", "--",
                                sys.executable, TRAIN, timeout=240)
    assert reference.returncode == 0, reference.stderr
    (project.path / "steps.log").unlink()
    cut = project.prudent("run", "--run-id", "cut", "--set", "kill_at_step=50", "--",
                          sys.executable, TRAIN, timeout=240)
    assert cut.returncode == 128 + signal.SIGKILL, cut.stderr
    again = project.prudent("run", "--run-id", "cut", "--", sys.executable, TRAIN, timeout=240)
    assert again.returncode == 0, again.stderr
    assert f"DONE {STEPS}" in again.stdout
    before, after = attempts(project.path / "steps.log")
    assert before[-1] == 49 and after[0] == 47 and after[-1] == STEPS  # steps 47-49 again
    assert_identical(torch.load(project.path / "ref.pt", weights_only=True),
                     torch.load(project.path / "final.pt", weights_only=True))
    assert project.show("cut")["step"] == STEPS


@pytest.mark.slow
def test_ctrl_c_stops_lightning_with_exit_130_as_interrupted(project: Project) -> None:
    # Lightning itself turns a KeyboardInterrupt into exit code 1 (a failure to a supervisor)
    supervisor = subprocess.Popen(
        [sys.executable, "-m", "prudent", "run", "--run-id", "ctrl-c", "--set", "sleep_s=0.03",
         "--", sys.executable, TRAIN], cwd=project.path, env=project.env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    log = project.path / "steps.log"
    deadline = time.monotonic() + 120
    while not (log.exists() and len(log.read_text().splitlines()) >= 5):
        assert supervisor.poll() is None and time.monotonic() < deadline, supervisor.stderr
        time.sleep(0.05)
    supervisor.send_signal(signal.SIGINT)  # prudent run passes it on once, as a terminal would
    out, err = supervisor.communicate(timeout=120)
    assert supervisor.returncode == 130, err
    assert "DONE" not in out  # fit returned, the script did not go on
    run = project.show("ctrl-c")
    assert (run["status"], run["stop_reason"], run["exit_code"]) == ("stopped", "interrupted", 130)
    assert 5 <= run["step"] < STEPS


@pytest.mark.slow
def test_the_budget_stops_lightning_with_a_checkpoint_and_exit_4(project: Project) -> None:
    (project.path / "prices.csv").write_text(
        "cloud,instance,region,gpu,num_gpus,vcpus,memory_gib,on_demand_usd,spot_usd,prices_as_of\n"
        "test,pricey,lab,A100,1,8,64,3600,1800,2026-12-01\n")  # $1 a second
    (project.path / "prudent.yaml").write_text(
        "cost: {catalog_file: prices.csv, stop_margin: 0s, update_interval_s: 0.5, detect: 'off'}\n")
    result = project.prudent("run", "--run-id", "b", "--instance", "test:pricey",
                             "--budget-usd", "12", "--set", "sleep_s=0.2", "--",
                             sys.executable, TRAIN, timeout=240)
    assert result.returncode == 4, result.stderr
    assert "budget_usd $12.00 reached" in result.stderr and "DONE" not in result.stdout
    run = project.show("b")
    assert (run["status"], run["stop_reason"]) == ("stopped", "budget")
    assert 0 < run["step"] < STEPS and run["cost_usd"] > 0
    saved = [step for step, _, name in _events(run, "checkpoint") if name == "saved"]
    assert saved and saved[-1] == run["step"]  # the stop wrote a checkpoint


@pytest.mark.slow
def test_a_tuning_study_prunes_the_diverging_lightning_trial_with_exit_5(
        project: Project) -> None:
    (project.path / "space.yaml").write_text(
        "lr: {type: float, low: 0.01, high: 0.1, log: true}\n"
        "nan_at_step: {type: categorical, choices: [-1, 5]}\n")
    trials = ['{"lr": 0.05, "nan_at_step": -1}', '{"lr": 0.02, "nan_at_step": 5}',
              '{"lr": 0.03, "nan_at_step": -1}', '{"lr": 0.01, "nan_at_step": -1}']
    result = project.prudent(
        "tune", "--space", "space.yaml", "--objective", "val_acc", "--study", "s",
        "--trials", "4", "--pruner", "none", "--set", "max_epochs=1",
        *[arg for t in trials for arg in ("--enqueue", t)], "--",
        sys.executable, TRAIN, timeout=480)
    assert result.returncode == 0, result.stderr
    study = json.loads(project.prudent("study", "s", "--json").stdout)
    states = {t["number"]: (t["state"], t["pruned_by"]) for t in study["trials"]}
    assert states[1] == ("pruned", "rule:non_finite"), states
    assert [states[n][0] for n in (0, 2, 3)] == ["complete"] * 3, states
    sick = project.show(study["trials"][1]["run_id"])
    assert (sick["exit_code"], sick["stop_reason"]) == (5, "pruned")
    completed = [t["value"] for t in study["trials"] if t["state"] == "complete"]
    assert study["best_value"] == max(completed) and study["best_params"]["nan_at_step"] == -1


@pytest.mark.slow
def test_preflight_passes_the_lightning_example(project: Project) -> None:
    result = project.prudent("preflight", "--", sys.executable,
                             str(ROOT / "examples" / "lightning_digits.py"), timeout=480)
    assert result.returncode == 0, result.stdout + result.stderr
    for check in ("runs end to end", "losses are finite", "gradients reach every parameter",
                  "overfits one batch", "checkpoint round trip and exact resume"):
        assert f"PASS  {check}" in result.stdout, result.stdout
    # projected from the run as planned, in Lightning's optimizer steps (6 epochs x 45 batches)
    assert "full run: 270 optimizer steps x" in result.stdout and "+ 6 epochs x" in result.stdout


@pytest.mark.slow
def test_the_callback_works_with_the_pytorch_lightning_package(project: Project) -> None:
    result = project.prudent("run", "--run-id", "pl", "--set", "lr=0.2", "--",
                             sys.executable, script("pytorch_lightning_train.py"), timeout=240)
    assert result.returncode == 0, result.stderr
    assert "DONE 8 lr=0.2" in result.stdout  # --set reached the module's hparams (built with 0.5)
    assert project.show("pl")["step"] == 8


@pytest.mark.slow
def test_a_resumed_fit_writes_on_in_its_tensorboard_loggers_folder(project: Project) -> None:
    # Lightning opens a version_N+1 folder for each new process: a preempted fit resumed
    # used to be two TensorBoard runs, the second starting at the resumed step
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    # SIGTERM as step 12 starts (a preemption mid-epoch), relaunched by prudent run
    result = project.prudent("run", "--run-id", "tb", "--max-restarts", "1",
                             "--restart-backoff-s", "0.1", "--set", "tensorboard=true",
                             "--set", "term_at_step=12", "--", sys.executable, TRAIN,
                             timeout=240)
    assert result.returncode == 0, result.stderr
    assert project.show("tb")["restarts"] == 1
    folders = sorted(p.name for p in (project.path / "tb" / "lit").iterdir())
    assert folders == ["version_0"], folders
    board = EventAccumulator(str(project.path / "tb" / "lit" / "version_0"),
                             size_guidance={"scalars": 0})
    board.Reload()
    ours = [s.step for s in board.Scalars("prudent/loss")]
    assert ours == list(range(1, STEPS + 1))  # one curve: every step once
    theirs: dict[int, set[float]] = {}
    for point in board.Scalars("train_loss"):
        theirs.setdefault(point.step, set()).add(point.value)
    assert sorted(theirs) == list(range(STEPS))  # Lightning's steps, 0-based
    assert all(len(values) == 1 for values in theirs.values())  # a step again: the same value



def _preempted_and_resumed(project: Project, run_id: str, *settings: str) -> None:
    """lightning_train.py with SIGTERM as step 12 starts (a preemption mid-epoch), relaunched
    by prudent run and resumed from the checkpoint the stop saved."""
    sets = [arg for setting in settings for arg in ("--set", setting)]
    result = project.prudent("run", "--run-id", run_id, "--max-restarts", "1",
                             "--restart-backoff-s", "0.1", *sets, "--set", "term_at_step=12",
                             "--", sys.executable, TRAIN, timeout=240)
    assert result.returncode == 0, result.stderr
    assert project.show(run_id)["restarts"] == 1


def _once_each(steps: list[int], first: int) -> None:
    """One curve: every step from ``first`` to the last once, none twice."""
    assert sorted(steps) == list(range(first, first + STEPS)), sorted(steps)


@pytest.mark.slow
def test_a_resumed_fit_writes_on_in_its_csv_loggers_folder_without_a_step_twice(
        project: Project) -> None:
    # Lightning's CSVLogger opens version_N+1 in each new process; given the old folder
    # again, its writer deletes the metrics.csv there
    import csv

    _preempted_and_resumed(project, "csv", "logger=csv")
    folders = sorted(p.name for p in (project.path / "csv" / "lit").iterdir())
    assert folders == ["version_0"], folders
    with (project.path / "csv" / "lit" / "version_0" / "metrics.csv").open(newline="") as file:
        rows = list(csv.DictReader(file))
    _once_each([int(r["step"]) for r in rows if r["train_loss"]], 0)  # Lightning's, 0-based
    _once_each([int(r["step"]) for r in rows if r["prudent/loss"]], 1)  # prudent's
    assert [int(r["step"]) for r in rows if r["val_loss"]] == [22, 45, 68]  # each epoch's end
    marks = [int(r["step"]) for r in rows if r["prudent/event/lifecycle"]]
    assert 12 in marks, marks  # the SIGTERM's stop, marked where it stopped the first attempt


@pytest.mark.slow
def test_a_fit_resumed_after_a_kill_keeps_no_csv_row_of_the_steps_it_trains_again(
        project: Project) -> None:
    # checkpoints every 5 steps; killed as step 18 starts, after Lightning wrote the rows of
    # steps 16 and 17 (written out at each row): the resumed fit trains them again from 15
    import csv

    (project.path / "prudent.yaml").write_text("checkpoint: {every: 5steps}\n")
    sets = ["--set", "logger=csv", "--set", "csv_flush_every=1"]
    cut = project.prudent("run", "--run-id", "csvk", *sets, "--set", "kill_at_step=18", "--",
                          sys.executable, TRAIN, timeout=240)
    assert cut.returncode == 128 + signal.SIGKILL, cut.stderr
    again = project.prudent("run", "--run-id", "csvk", *sets, "--", sys.executable, TRAIN,
                            timeout=240)
    assert again.returncode == 0, again.stderr
    assert "resumed from" in again.stderr and "step 15" in again.stderr, again.stderr
    with (project.path / "csv" / "lit" / "version_0" / "metrics.csv").open(newline="") as file:
        rows = list(csv.DictReader(file))
    _once_each([int(r["step"]) for r in rows if r["train_loss"]], 0)
    ours = [int(r["step"]) for r in rows if r["prudent/loss"]]
    # each at most once (the rows of the killed process's last second may never have reached
    # the file: Lightning writes what prudent hands it, prudent hands it what its tracking
    # thread has seen)
    assert len(ours) == len(set(ours)) and max(ours) == STEPS, ours


@pytest.mark.slow
def test_a_resumed_fit_logs_on_in_its_mlflow_loggers_run_without_a_step_twice(
        project: Project, mlflow_server: str) -> None:  # noqa: F811
    from mlflow import MlflowClient
    from mlflow.entities import ViewType

    project.env.update(MLFLOW_ENV, MLFLOW_TRACKING_URI=mlflow_server)
    _preempted_and_resumed(project, "mlf", "logger=mlflow")
    client = MlflowClient(mlflow_server)
    experiment = client.get_experiment_by_name("lit").experiment_id
    (found,) = client.search_runs([experiment])  # one run for both attempts
    run_id = found.info.run_id
    # the run Lightning opened for the second attempt, before prudent's callback ran: deleted
    # (MLflow's bin, `mlflow gc` empties it), nothing in it
    others = [r for r in client.search_runs([experiment], run_view_type=ViewType.ALL)
              if r.info.run_id != run_id]
    assert [(r.info.lifecycle_stage, r.data.metrics) for r in others] == [("deleted", {})]
    assert found.info.status == "FINISHED" and found.data.tags["prudent.status"] == "completed"
    _once_each([m.step for m in client.get_metric_history(run_id, "train_loss")], 0)
    _once_each([m.step for m in client.get_metric_history(run_id, "prudent/loss")], 1)
    assert 12 in [m.step for m in client.get_metric_history(run_id, "prudent.event.lifecycle")]


@pytest.mark.slow
def test_a_resumed_fit_logs_on_in_its_wandb_loggers_run_without_a_step_twice(
        project: Project) -> None:
    pytest.importorskip("wandb")
    from tests.tracking.wandb_files import offline_runs

    project.env.update(WANDB_MODE="offline", WANDB_SILENT="true")
    _preempted_and_resumed(project, "wb", "logger=wandb")
    # offline, each process writes a folder of its own under the logger's save_dir (".");
    # the one Lightning opened for a second W&B run before prudent's callback ran is gone
    attempts = offline_runs(project.path)
    assert len(attempts) == 2 and attempts[0].run_id == attempts[1].run_id, [
        a.run_id for a in attempts]  # the same W&B run, which `wandb sync` joins
    rows = [row for attempt in attempts for row in attempt.history.values()]
    _once_each([row["trainer/global_step"] for row in rows if "train_loss" in row], 0)
    _once_each([row["prudent/step"] for row in rows if "prudent/loss" in row], 1)
    assert attempts[1].summary["prudent/status"] == "completed"


@pytest.mark.slow
def test_sigterm_at_an_epochs_last_batch_resumes_bit_identical_with_its_validation_once(
        project: Project) -> None:
    """The stop waits for the epoch's end (its validation) as a periodic checkpoint does:
    taken at the last batch, Lightning restarted with the next epoch and without that epoch's
    validation, whose loader draws from the RNG; the next epoch's order differed (max |dw|
    0.057) and the epoch's validation was never recorded."""
    reference = project.prudent("run", "--run-id", "ref", "--set", "out=ref.pt", "--",
                                sys.executable, TRAIN, timeout=240)
    assert reference.returncode == 0, reference.stderr
    result = project.prudent("run", "--run-id", "last", "--max-restarts", "1",
                             "--restart-backoff-s", "0.1", "--set", "term_at_step=23", "--",
                             sys.executable, TRAIN, timeout=240)
    assert result.returncode == 0, result.stderr
    assert "relaunch 1 of 1 after exit code 75" in result.stderr and f"DONE {STEPS}" in result.stdout
    assert "resumed from ckpt-0000000023: step 23, epoch 2, 0 batches into it" in result.stderr
    assert_identical(torch.load(project.path / "ref.pt", weights_only=True),
                     torch.load(project.path / "final.pt", weights_only=True))
    db = project.path / ".prudent" / "prudent.db"
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        validated = [s for (s,) in conn.execute(
            "SELECT step FROM metrics WHERE run_id = 'last' AND name = 'val_acc' ORDER BY step")]
    assert validated == [23, 46, 69]  # each epoch's validation once
