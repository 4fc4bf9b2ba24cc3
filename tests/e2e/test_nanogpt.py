"""A nanoGPT-style script (scripts/nanogpt.py: no epochs, no DataLoader, 2 micro-steps, a
hand-set cosine learning rate, an evaluation every N iterations) under profile, tune and kills."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.e2e.conftest import Project, child_of, script, steps_trained, two_machines

NANOGPT = script("nanogpt.py")
# enqueued so that the order is known: the best first, then three the pruner should stop
LRS = (1e-2, 1e-4, 3e-5, 3e-3)


def test_prudent_profile_of_a_nanogpt_run_exits_0_and_speaks_in_steps(project: Project) -> None:
    (project.path / "prudent.yaml").write_text("profile: {interval_s: 0.05}\n")
    ran = project.prudent("run", "--run-id", "gpt", "--set", "max_iters=60", "--", sys.executable,
                          NANOGPT)
    assert ran.returncode == 0, ran.stderr
    assert "prudent | gpt | step 20: val_loss=" in ran.stderr and "epoch" not in ran.stderr
    shown = project.prudent("profile", "gpt")
    assert shown.returncode == 0, shown.stderr
    assert "profile: 60 steps" in shown.stdout and "recent throughput: " in shown.stdout
    assert "samples/s" not in shown.stdout and "epoch" not in shown.stdout
    document = json.loads(project.prudent("profile", "gpt", "--json").stdout)
    assert document["profile"]["throughput"]["samples_per_s"] is None


def _intermediate(project: Project, name: str) -> dict[int, dict[int, float]]:
    from prudent.tune.study import load, open_storage, storage_url

    study = load(name, open_storage(storage_url(project.path / ".prudent", name)))
    return {t.number: dict(t.intermediate_values) for t in study.get_trials()}


@pytest.mark.slow
def test_a_tuned_nanogpt_reports_every_evaluation_at_its_step_and_the_pruner_prunes(
        project: Project) -> None:
    (project.path / "space.yaml").write_text(
        "lr: {type: float, low: 1.0e-5, high: 3.0e-2, log: true}\n")
    (project.path / "prudent.yaml").write_text("checkpoint: {every: 1000steps}\n")
    flags = [arg for lr in LRS for arg in ("--enqueue", json.dumps({"lr": lr}))]
    started = time.monotonic()
    result = project.prudent(
        "tune", "--space", "space.yaml", "--objective", "val_loss", "--direction", "min",
        "--study", "gpt", "--trials", "4", "--pruner", "asha", "--min-resource", "40",
        "--set", "max_iters=300", "--set", "eval_interval=20", "--max-steps", "100", *flags,
        "--", sys.executable, NANOGPT, timeout=240)
    seconds = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    assert "each trial runs with OMP_NUM_THREADS=" in result.stderr
    summary: dict[str, Any] = json.loads(project.prudent("study", "gpt", "--json").stdout)
    trials = {t["number"]: t for t in summary["trials"]}
    values = _intermediate(project, "gpt")
    print(f"tune: {seconds:.1f} s;", {n: (t["state"], t["steps"], round(t["duration_s"], 1),
                                          sorted(values[n])) for n, t in trials.items()})
    assert summary["unit"] == "step" and "steps used" in result.stdout
    for number, reported in values.items():  # every evaluation, at its iteration
        assert len(reported) >= 3 and set(reported) <= set(range(0, 101, 20)), (number, reported)
    states = [trials[n]["state"] for n in range(4)]
    assert states[0] == "complete" and trials[0]["steps"] == 100  # the step budget: complete
    assert sorted(values[0]) == [0, 20, 40, 60, 80]
    assert trials[0]["value"] == values[0][80] == summary["best_value"]
    assert states.count("pruned") >= 1
    for t in trials.values():
        assert t["pruned_by"] in (None, "pruner") and t["params"]["lr"] in LRS
        run = project.show(t["run_id"])
        assert run["config"]["max_iters"] == 300 and run["config"]["eval_interval"] == 20


def _checkpoints(folder: Path) -> set[str]:
    return {p.name for p in folder.glob("ckpt-*")} if folder.is_dir() else set()


@pytest.mark.slow
def test_a_nanogpt_killed_twice_ends_with_the_weights_of_an_uninterrupted_run(
        project: Project) -> None:
    """No DataLoader, batches from torch.randint, a hand-set learning rate, 2 micro-steps:
    SIGKILLed twice under --max-restarts, the final weights are torch.equal to a run never
    interrupted (the generators come back with the checkpoint, the loop's counter too)."""
    project.env.update({"PRUDENT_CHECKPOINT_EVERY": "5steps", "PRUDENT_CONSOLE": "off"})
    common = ["--set", "max_iters=80", "--set", "eval_interval=20"]
    reference = project.prudent("run", "--run-id", "reference", *common, "--set",
                                "out=reference.pt", "--", sys.executable, script("nanogpt.py"),
                                timeout=300)
    assert reference.returncode == 0, reference.stderr
    checkpoints = project.path / ".prudent" / "runs" / "victim" / "checkpoints"
    supervisor = subprocess.Popen(
        [sys.executable, "-m", "prudent", "run", "--run-id", "victim", "--max-restarts", "4",
         "--restart-backoff-s", "0.1", *common, "--set", "sleep_s=0.03", "--set", "out=final.pt",
         "--", sys.executable, script("nanogpt.py")],
        cwd=project.path, env=project.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    rng, child = random.Random(3), None
    for _ in range(2):
        child = child_of(supervisor, child.pid if child else None)
        seen = _checkpoints(checkpoints)
        deadline = time.monotonic() + 60
        while len(_checkpoints(checkpoints) - seen) < rng.randint(1, 2):  # mid-run, after a save
            assert time.monotonic() < deadline, "no checkpoint was written"
            time.sleep(0.02)
        time.sleep(rng.uniform(0.0, 0.1))
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=60)
    _, err = supervisor.communicate(timeout=300)
    assert supervisor.returncode == 0, err
    final = torch.load(project.path / "final.pt", weights_only=True)
    expected = torch.load(project.path / "reference.pt", weights_only=True)
    assert final.keys() == expected.keys()
    assert all(torch.equal(final[k], expected[k]) for k in expected)
    shown = project.show("victim")
    assert shown["restarts"] == 2 and shown["status"] == "completed" and shown["step"] == 80


@pytest.mark.slow  # four short processes: about 15 s on an idle 2-core machine
def test_an_iteration_loop_whose_updates_are_skipped_survives_a_vanished_machine(
        tmp_path: Path, project: Project) -> None:
    """run.steps, 2 micro-steps, AdamW, its own generator, and loss_spike skipping a few
    updates: SIGKILL on one machine, the same command on a second with an empty disk and
    home; the skips and the final weights are those of a run never interrupted."""
    old, new = two_machines(tmp_path, "every: 50steps")
    train = [sys.executable, script("bigram_skips.py")]
    reference = project.prudent("run", "--run-id", "ref", "--set", "out=ref.pt", "--", *train,
                                timeout=240)
    assert reference.returncode == 0, reference.stderr
    skipped = _skipped(project.show("ref"))
    assert len(skipped) >= 3 and max(skipped) > 530  # some after the resume point below
    cut = old.prudent("run", "--run-id", "spot", "--set", "kill_at_step=530", "--set",
                      "sleep_s=0.002", "--", *train, timeout=240)
    assert cut.returncode == 128 + signal.SIGKILL, cut.stderr
    again = new.prudent("run", "--run-id", "spot", "--", *train, timeout=240)
    assert again.returncode == 0, again.stderr
    steps = steps_trained(new)
    assert steps[0] in (501, 451) and steps[-1] == 600  # from the newest checkpoint that landed
    final = torch.load(new.path / "final.pt", weights_only=True)
    expected = torch.load(project.path / "ref.pt", weights_only=True)
    assert all(torch.equal(final[k], expected[k]) for k in expected)
    # the new machine's skips (the record also holds those the killed machine made after the
    # checkpoint it resumes from, when its record thread sent them before the kill)
    events = new.show("spot")["events"]
    began = max(e["wall"] for e in events if (e["kind"], e["name"]) == ("lifecycle", "start"))
    assert [e["step"] for e in events if e["name"] == "skipped_update" and e["wall"] >= began
            ] == [s for s in skipped if s >= steps[0]]


def _skipped(run: dict[str, Any]) -> list[int]:
    return [e["step"] for e in run["events"] if e["name"] == "skipped_update"]


def test_prudent_preflight_of_a_nanogpt_passes_in_steps_with_a_projection(
        project: Project) -> None:
    started = time.monotonic()
    result = project.prudent("preflight", "--json", "--", sys.executable, NANOGPT, timeout=120)
    seconds = time.monotonic() - started
    assert result.returncode == 0, result.stdout + result.stderr
    assert seconds < 60
    document = json.loads(result.stdout)
    checks = {c["id"]: c for c in document["checks"]}
    assert all(c["status"] == "pass" or (c["status"] == "skip" and c["summary"])
               for c in checks.values()), checks
    assert checks["overfit"]["status"] == "pass"  # the first step's batches, drawn again
    assert "drawn again every step" in checks["overfit"]["summary"]
    assert not any("epoch(s)" in c["summary"] for c in checks.values())
    assert checks["cost"]["status"] == "pass"
    assert "full run: 200 steps x " in checks["cost"]["summary"]
    assert document["projection"]["num_steps"] == 200 and document["projection"]["hours"] > 0
    assert document["processes"]["smoke"]["seconds"] < 30  # shortened, not 200 iterations


@pytest.mark.slow  # four short processes
def test_preflight_ends_the_smoke_run_of_a_loop_that_counts_its_own_iterations(
        project: Project) -> None:
    """``for it in range(...)`` around run.step(): smoke mode cannot shorten that loop, so it
    is stopped after the smoke run's steps (it used to train all 200 iterations, or until the
    timeout on a real run), told how to let smoke mode end it, and still checked for resume."""
    project.env["PRUDENT_SET"] = json.dumps({"own_counter": True})
    result = project.prudent("preflight", "--json", "--", sys.executable, NANOGPT, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    document = json.loads(result.stdout)
    checks = {c["id"]: c for c in document["checks"]}
    assert checks["runs"]["status"] == "warn"
    assert "counts its own iterations, so smoke mode had to stop it" in checks["runs"]["summary"]
    assert "run.steps(max_iters)" in checks["runs"]["fix"]
    assert checks["resume"]["status"] == "pass", checks["resume"]
    assert len(document["processes"]) >= 3
    assert document["processes"]["smoke"]["seconds"] < 30  # 16 steps, not 200


@pytest.mark.slow
def test_preflight_names_a_batch_generator_the_checkpoint_does_not_hold(project: Project) -> None:
    result = project.prudent("preflight", "--json", "--", sys.executable,
                             script("preflight_own_generator.py"), timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr
    checks = {c["id"]: c for c in json.loads(result.stdout)["checks"]}
    assert checks["overfit"]["status"] == "skip"  # no batch could be repeated: no verdict
    assert "from a source prudent cannot rewind" in checks["overfit"]["summary"]
    assert checks["resume"]["status"] == "fail"
    assert "the model was fed other batches" in checks["resume"]["summary"]
    assert "torch.Generator or np.random.default_rng of your own" in checks["resume"]["fix"]
    assert [c["id"] for c in checks.values() if c["status"] == "fail"] == ["resume"]
