"""prudent.transformers end to end: the Hugging Face Trainer in real processes, under real
`prudent run`, `tune` and `preflight` commands (tests/e2e/scripts/transformers_train.py: a
2-layer BERT built from a config, generated token sequences)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest
import torch

from tests.e2e.conftest import ROOT, Project, child_of, script, steps_trained, two_machines
from tests.e2e.test_resume import assert_identical, attempts

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

TRAIN = script("transformers_train.py")
STEPS = 16  # 2 epochs of 256 sequences in batches of 32


def _saved(run: dict) -> list[int]:
    return [e["step"] for e in run["events"] if (e["kind"], e["name"]) == ("checkpoint", "saved")]


def test_a_healthy_trainer_run_is_recorded_with_metrics_profile_and_cost(
        project: Project) -> None:
    result = project.prudent("run", "--run-id", "healthy", "--set", "learning_rate=0.003",
                             "--", sys.executable, TRAIN, timeout=240)
    assert result.returncode == 0, result.stderr
    assert f"DONE {STEPS}" in result.stdout
    run = project.show("healthy")
    assert (run["status"], run["exit_code"], run["step"]) == ("completed", 0, STEPS)
    # --set reached TrainingArguments; the Trainer's other hyperparameters joined the config
    assert run["config"]["learning_rate"] == 0.003 and run["config"]["weight_decay"] == 0.0
    assert "eval_accuracy" in run["metrics"] and "loss" in run["metrics"]
    assert run["profile"]["num_steps"] == STEPS and run["profile"]["breakdown"]["eval"]["s"] > 0
    assert run["cost"]["attempts"] == 1


@pytest.mark.slow
def test_a_nan_step_is_stopped_by_non_finite_with_exit_3_despite_the_nan_filter(
        project: Project) -> None:
    # logging_nan_inf_filter is on by default: the Trainer's logged loss would hide the NaN
    (project.path / "prudent.yaml").write_text("checkpoint: {every: 4steps}\n")
    result = project.prudent("run", "--run-id", "nan", "--set", "nan_at_step=6", "--",
                             sys.executable, TRAIN, timeout=240)
    assert result.returncode == 3, result.stderr
    assert "rule non_finite: loss is NaN at step 6" in result.stderr
    run = project.show("nan")
    assert (run["status"], run["stop_reason"], run["step"]) == ("stopped", "rule:non_finite", 6)
    assert _saved(run) and max(_saved(run)) < 6  # the NaN weights were never saved
    assert "DONE" not in result.stdout


@pytest.mark.slow
def test_sigterm_exits_75_and_the_relaunch_resumes_to_identical_weights(
        project: Project) -> None:
    reference = project.prudent("run", "--run-id", "ref", "--set", "out=ref.pt", "--",
                                sys.executable, TRAIN, timeout=240)
    assert reference.returncode == 0, reference.stderr
    (project.path / "steps.log").unlink()
    supervisor = subprocess.Popen(
        [sys.executable, "-m", "prudent", "run", "--run-id", "victim", "--max-restarts", "1",
         "--restart-backoff-s", "0.1", "--set", "sleep_s=0.2", "--", sys.executable, TRAIN],
        cwd=project.path, env=project.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    child = child_of(supervisor, None)
    log = project.path / "steps.log"
    deadline = time.monotonic() + 120
    while not (log.exists() and len(log.read_text().splitlines()) >= 5):  # mid epoch 1 of 2
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
    assert (run["status"], run["restarts"]) == ("completed", 1)
    assert before[-1] in _saved(run)  # the stop saved the Trainer's checkpoint at once


def test_a_vanished_machine_resumes_on_a_new_one_from_prudents_newest_checkpoint(
        tmp_path, project: Project) -> None:
    # save_strategy="no" (the script's): the Trainer writes no folder of its own, so only
    # prudent's periodic checkpoints (every 5 steps, to a shared folder standing in for a
    # bucket) survive the machine; the new machine has an empty disk and home
    old, new = two_machines(tmp_path, "every: 5steps")
    reference = project.prudent("run", "--run-id", "ref", "--set", "out=ref.pt", "--",
                                sys.executable, TRAIN, timeout=240)
    assert reference.returncode == 0, reference.stderr
    # checkpoints at 5, 8 (epoch end), 13; slow steps let step 13's reach the bucket
    cut = old.prudent("run", "--run-id", "spot", "--set", "kill_at_step=15",
                      "--set", "sleep_s=0.3", "--", sys.executable, TRAIN, timeout=240)
    assert cut.returncode == 128 + signal.SIGKILL, cut.stderr
    again = new.prudent("run", "--run-id", "spot", "--", sys.executable, TRAIN, timeout=240)
    assert again.returncode == 0, again.stderr
    assert f"DONE {STEPS}" in again.stdout
    steps = steps_trained(new)
    assert steps == list(range(14, STEPS + 1))  # from step 13's checkpoint: 14 and 15 again
    assert_identical(torch.load(project.path / "ref.pt", weights_only=True),
                     torch.load(new.path / "final.pt", weights_only=True))
    run = new.show("spot")
    assert (run["status"], run["step"]) == ("completed", STEPS)


@pytest.mark.slow
def test_a_run_started_again_after_a_kill_writes_on_in_its_tensorboard_folder_each_step_once(
        project: Project) -> None:
    # the Trainer's report_to TensorBoard: a new folder at every start, unless prudent points
    # the resumed attempt back at the first one's, whose steps from the resumed one on are
    # purged (the killed attempt wrote steps its checkpoint does not hold)
    pytest.importorskip("tensorboard")
    from tests.tracking.test_tensorboard import read

    (project.path / "prudent.yaml").write_text("checkpoint: {every: 5steps}\n")
    tb = ("--set", "report_to=tensorboard")
    cut = project.prudent("run", "--run-id", "tb", *tb, "--set", "kill_at_step=15", "--",
                          sys.executable, TRAIN, timeout=240)
    assert cut.returncode == 128 + signal.SIGKILL, cut.stderr
    time.sleep(1.1)  # the Trainer's folder is named by the second it starts in
    again = project.prudent("run", "--run-id", "tb", *tb, "--", sys.executable, TRAIN,
                            timeout=240)
    assert again.returncode == 0, again.stderr
    trained = steps_trained(project)
    assert trained.count(15) == 2  # steps after the last checkpoint were trained twice
    (folder,) = {f.parent for f in (project.path / "hf-out").rglob("*tfevents*")}
    board = read(folder)
    assert [s.step for s in board.Scalars("train/loss")] == [5, 10, 15]  # the Trainer's own
    assert [s.step for s in board.Scalars("prudent/loss")] == list(range(1, STEPS + 1))


@pytest.mark.slow
def test_the_budget_stops_the_trainer_with_its_checkpoint_and_exit_4(project: Project) -> None:
    (project.path / "prices.csv").write_text(
        "cloud,instance,region,gpu,num_gpus,vcpus,memory_gib,on_demand_usd,spot_usd,prices_as_of\n"
        "test,pricey,lab,A100,1,8,64,3600,1800,2026-12-01\n")  # $1 a second
    (project.path / "prudent.yaml").write_text(
        "cost: {catalog_file: prices.csv, stop_margin: 0s, update_interval_s: 0.5, detect: 'off'}\n")
    result = project.prudent("run", "--run-id", "b", "--instance", "test:pricey",
                             "--budget-usd", "12", "--set", "sleep_s=1", "--",
                             sys.executable, TRAIN, timeout=240)
    assert result.returncode == 4, result.stderr
    assert "budget_usd $12.00 reached" in result.stderr and "DONE" not in result.stdout
    run = project.show("b")
    assert (run["status"], run["stop_reason"]) == ("stopped", "budget")
    assert 0 < run["step"] < STEPS and _saved(run)[-1] == run["step"]
    assert (project.path / "hf-out" / f"checkpoint-{run['step']}").is_dir()


@pytest.mark.slow
def test_a_tuning_study_prunes_the_diverging_trainer_trial_with_exit_5(
        project: Project) -> None:
    (project.path / "space.yaml").write_text(
        "learning_rate: {type: float, low: 1.0e-4, high: 1.0e-2, log: true}\n"
        "nan_at_step: {type: categorical, choices: [-1, 3]}\n")
    trials = ['{"learning_rate": 0.002, "nan_at_step": -1}',
              '{"learning_rate": 0.001, "nan_at_step": 3}',
              '{"learning_rate": 0.003, "nan_at_step": -1}',
              '{"learning_rate": 0.0005, "nan_at_step": -1}']
    result = project.prudent(
        "tune", "--space", "space.yaml", "--objective", "eval_accuracy", "--study", "s",
        "--trials", "4", "--pruner", "none", "--set", "num_train_epochs=1",
        *[arg for t in trials for arg in ("--enqueue", t)], "--",
        sys.executable, TRAIN, timeout=480)
    assert result.returncode == 0, result.stderr
    study = json.loads(project.prudent("study", "s", "--json").stdout)
    states = {t["number"]: (t["state"], t["pruned_by"]) for t in study["trials"]}
    assert states[1] == ("pruned", "rule:non_finite"), states
    assert [states[n][0] for n in (0, 2, 3)] == ["complete"] * 3, states
    sick = project.show(study["trials"][1]["run_id"])
    assert (sick["exit_code"], sick["stop_reason"]) == (5, "pruned")


@pytest.mark.slow
def test_preflight_passes_the_transformers_example(project: Project) -> None:
    result = project.prudent("preflight", "--", sys.executable,
                             str(ROOT / "examples" / "transformers_tiny_bert.py"), timeout=480)
    assert result.returncode == 0, result.stdout + result.stderr
    for check in ("runs end to end", "losses are finite", "gradients reach every parameter",
                  "checkpoint round trip and exact resume"):
        assert f"PASS  {check}" in result.stdout, result.stdout
