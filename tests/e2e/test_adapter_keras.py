"""prudent.keras end to end: Keras 3's own model.fit on the torch backend in real processes,
under real `prudent run` commands (tests/e2e/scripts/keras_train.py). Importing keras is slow:
each test starts as few processes as it can."""

from __future__ import annotations

import importlib.util
import json
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.e2e.conftest import ROOT, Project, child_of, script, steps_trained, two_machines
from tests.e2e.test_resume import attempts

# the scripts import keras on the torch backend; this process need not import it at all
if importlib.util.find_spec("keras") is None:
    pytest.skip("keras is not installed: pip install 'prudent[keras]'", allow_module_level=True)

TRAIN = script("keras_train.py")
STEPS = 69  # 3 epochs of 23 batches (1437 digits in batches of 64)


def _events(run: dict, *kinds: str) -> list[tuple[int, str, str]]:
    return [(e["step"], e["kind"], e["name"]) for e in run["events"] if e["kind"] in kinds]


def test_a_healthy_keras_run_is_recorded_with_metrics_profile_and_cost(project: Project) -> None:
    result = project.prudent("run", "--run-id", "healthy", "--set", "epochs=1",
                             "--set", "learning_rate=0.1", "--", sys.executable, TRAIN,
                             timeout=240)
    assert result.returncode == 0, result.stderr
    assert "DONE 23" in result.stdout
    run = project.show("healthy")
    assert (run["status"], run["exit_code"], run["step"]) == ("completed", 0, 23)
    # fit's own settings and the optimizer joined the config; --set reached the optimizer
    assert run["config"]["learning_rate"] == 0.1 and run["config"]["steps_per_epoch"] == 23
    assert run["config"]["optimizer"] == "SGD"
    assert run["metrics"]["val_accuracy"] > 0.3 and "loss" in run["metrics"]
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
    # the step's own loss (Keras logs the epoch's running mean): the last finite one is a
    # single batch's
    assert "rule non_finite: loss is NaN at step 25" in result.stderr
    run = project.show("nan")
    assert (run["status"], run["stop_reason"], run["step"]) == ("stopped", "rule:non_finite", 25)
    saved = [step for step, _, name in _events(run, "checkpoint") if name == "saved"]
    assert saved and max(saved) < 25  # the last good checkpoint; the NaN weights never saved
    assert "DONE" not in result.stdout  # fit returned, the script did not go on


@pytest.mark.slow
def test_sigterm_mid_epoch_exits_75_and_the_relaunch_ends_with_identical_weights(
        project: Project) -> None:
    # with a Dropout layer: Keras draws its masks from a SeedGenerator of its own
    reference = project.prudent("run", "--run-id", "ref", "--set", "out=ref.npz",
                                "--set", "dropout=0.3", "--", sys.executable, TRAIN, timeout=240)
    assert reference.returncode == 0, reference.stderr
    (project.path / "steps.log").unlink()
    supervisor = subprocess.Popen(
        [sys.executable, "-m", "prudent", "run", "--run-id", "victim", "--max-restarts", "1",
         "--restart-backoff-s", "0.1", "--set", "sleep_s=0.03", "--set", "dropout=0.3", "--",
         sys.executable, TRAIN],
        cwd=project.path, env=project.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    child = child_of(supervisor, None)
    log = project.path / "steps.log"
    deadline = time.monotonic() + 180
    while not (log.exists() and len(log.read_text().splitlines()) >= 30):  # epoch 2 of 3
        assert supervisor.poll() is None and time.monotonic() < deadline, supervisor.stderr
        time.sleep(0.05)
    child.terminate()
    out, err = supervisor.communicate(timeout=240)
    assert supervisor.returncode == 0, err
    assert "relaunch 1 of 1 after exit code 75" in err and f"DONE {STEPS}" in out
    before, after = attempts(log)
    assert before[-1] % 23 and after[0] == before[-1] + 1  # mid-epoch; no step redone or lost
    assert after[-1] == STEPS
    ref, final = np.load(project.path / "ref.npz"), np.load(project.path / "final.npz")
    assert ref.files == final.files  # the weights and the optimizer's state, bit for bit
    for key in ref.files:
        assert np.array_equal(ref[key], final[key]), key
    run = project.show("victim")
    assert (run["status"], run["restarts"], run["step"]) == ("completed", 1, STEPS)
    names = _events(run, "checkpoint", "lifecycle")
    assert (before[-1], "checkpoint", "saved") in names  # the stop saved at once
    assert any(name == "resumed" for _, _, name in names)


@pytest.mark.slow
def test_a_vanished_machine_resumes_on_a_new_one_to_identical_weights(
        tmp_path, project: Project) -> None:
    # checkpoints every 10 steps and at each epoch's end to a shared folder standing in for a
    # bucket; the second machine has an empty disk and home
    old, new = two_machines(tmp_path, "every: 10steps")
    reference = project.prudent("run", "--run-id", "ref", "--set", "out=ref.npz",
                                "--set", "dropout=0.3", "--", sys.executable, TRAIN, timeout=240)
    assert reference.returncode == 0, reference.stderr
    # checkpoints at 10, 20, 23 (epoch end), 33; slow steps let step 33's reach the bucket
    cut = old.prudent("run", "--run-id", "spot", "--set", "dropout=0.3", "--set",
                      "kill_at_step=35", "--set", "sleep_s=0.1", "--", sys.executable, TRAIN,
                      timeout=240)
    assert cut.returncode == 128 + signal.SIGKILL, cut.stderr
    again = new.prudent("run", "--run-id", "spot", "--set", "dropout=0.3", "--",
                        sys.executable, TRAIN, timeout=240)
    assert again.returncode == 0, again.stderr
    steps = steps_trained(new)
    assert steps == list(range(34, STEPS + 1))  # from step 33's checkpoint: 34 and 35 again
    ref, final = np.load(project.path / "ref.npz"), np.load(new.path / "final.npz")
    for key in ref.files:
        assert np.array_equal(ref[key], final[key]), key
    assert new.show("spot")["step"] == STEPS


@pytest.mark.slow
def test_the_budget_stops_keras_with_a_checkpoint_and_exit_4(project: Project) -> None:
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
def test_a_tuning_study_prunes_the_diverging_keras_trial_with_exit_5(project: Project) -> None:
    (project.path / "space.yaml").write_text(
        "learning_rate: {type: float, low: 0.01, high: 0.1, log: true}\n"
        "nan_at_step: {type: categorical, choices: [-1, 5]}\n")
    trials = ['{"learning_rate": 0.05, "nan_at_step": -1}',
              '{"learning_rate": 0.02, "nan_at_step": 5}',
              '{"learning_rate": 0.03, "nan_at_step": -1}',
              '{"learning_rate": 0.01, "nan_at_step": -1}']
    result = project.prudent(
        "tune", "--space", "space.yaml", "--objective", "val_accuracy", "--study", "s",
        "--trials", "4", "--pruner", "none", "--set", "epochs=1",
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
def test_preflight_passes_the_keras_example(project: Project) -> None:
    result = project.prudent("preflight", "--", sys.executable,
                             str(ROOT / "examples" / "keras_digits.py"), timeout=480)
    assert result.returncode == 0, result.stdout + result.stderr
    for check in ("runs end to end", "losses are finite", "gradients reach every parameter",
                  "checkpoint round trip and exact resume"):
        assert f"PASS  {check}" in result.stdout, result.stdout
    # Keras draws its batch order from its own generator: one batch cannot be repeated
    assert "SKIP  overfits one batch" in result.stdout
    assert "6 epochs x 45 batches" in result.stdout  # projected from the run as planned
