"""Under torchrun (gloo on CPU): rank 0 writes, every rank restores, ranks stop together."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.e2e.conftest import Project, torchrun_command
from tests.e2e.test_resume import assert_identical, attempts, final_state

# the ranks agree at every step (by default about every 0.2 s of training, which on these
# runs' ~1 ms steps would land a stop many steps after it was asked): the steps asserted
# below are then exact
EVERY_STEP = {"PRUDENT_RANKS_AGREE_EVERY_S": "0"}


def torchrun(*args: str) -> list[str]:
    return [*torchrun_command("ddp_train.py"), *args]


@pytest.mark.slow
def test_stop_on_one_rank_stops_all_at_the_same_step_and_resume_is_exact(project: Project) -> None:
    project.env.update({"PRUDENT_CHECKPOINT_EVERY": "1000steps", "PRUDENT_CONSOLE": "off", **EVERY_STEP})
    reference = project.prudent("run", "--run-id", "reference", "--set", "out=ref.pt", "--",
                                *torchrun(), timeout=300)
    assert reference.returncode == 0, reference.stderr
    for rank in (0, 1):
        (project.path / f"rank{rank}.log").unlink()

    result = project.prudent("run", "--run-id", "ddp", "--max-restarts", "1", "--restart-backoff-s",
                             "0.1", "--set", "stop_rank1_at=11", "--", *torchrun(), timeout=300)
    assert result.returncode == 0, result.stderr
    rank0, rank1 = attempts(project.path / "rank0.log"), attempts(project.path / "rank1.log")
    # asked during step 11, agreed as step 12 ends (no barrier in the step): both stop there
    assert rank0[0][-1] == rank1[0][-1] == 12
    assert rank0[1][0] == rank1[1][0] == 13  # and both resumed at step 13
    assert_identical(final_state(project.path / "ref.pt"), final_state(project.path / "final.pt"))
    shown = project.show("ddp")
    assert shown["restarts"] == 1 and shown["status"] == "completed"
    stops = [e for e in shown["events"] if e["name"] == "stop_requested"]
    assert stops and "(requested on rank 1)" in stops[0]["message"]
    saved = [e for e in shown["events"] if e["name"] == "saved"]
    assert [e["step"] for e in saved][:1] == [12]
    checkpoints = project.path / ".prudent" / "runs" / "ddp" / "checkpoints"
    assert len(list(checkpoints.glob("ckpt-*"))) >= 1


@pytest.mark.slow
def test_a_skip_one_rank_asks_for_is_made_on_every_rank(project: Project) -> None:
    # only rank 1's loss is an outlier: before the ranks agreed, rank 1 skipped its update
    # alone and the two replicas ended 0.09 apart (max |dw|) with nothing said
    (project.path / "prudent.yaml").write_text(
        "monitor:\n  rules:\n    exploding_gradient: {action: [alert]}\n"
        "    divergence: {action: [alert]}\n")
    result = project.prudent("run", "--run-id", "spike", "--",
                             *torchrun_command("ddp_spike_one_rank.py"), timeout=300)
    assert result.returncode == 0, result.stderr
    assert float((project.path / "replicas.txt").read_text()) == 0.0
    skips = [e for e in project.show("spike")["events"] if e["name"] == "skipped_update"]
    assert [e["step"] for e in skips] == [251]
    assert "another rank's loss at step 251" in skips[0]["message"]
    assert "on all 2 ranks alike" in skips[0]["message"]


@pytest.mark.slow
def test_a_completed_job_whose_script_ends_on_a_gloo_collective_exits_0(project: Project) -> None:
    # a gloo worker thread releasing the last collective's tensors as the interpreter
    # finalizes aborted the rank (SIGABRT): torchrun then called the completed run failed.
    # On one CPU, without the grace, 10 jobs of 11 aborted so
    one_cpu = min(os.sched_getaffinity(0))
    # the interpreter's whole exit, without the tests' shortcut (tests/_fast_exit)
    project.env["PYTHONPATH"] = os.pathsep.join(
        p for p in project.env.get("PYTHONPATH", "").split(os.pathsep) if "_fast_exit" not in p)
    result = subprocess.run(
        ["taskset", "--cpu-list", str(one_cpu), sys.executable, "-m", "prudent", "run",
         "--run-id", "gather", "--", *torchrun_command("ddp_last_gather.py")],
        cwd=project.path, env=project.env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "terminate called" not in result.stderr
    assert project.show("gather")["status"] == "completed"


@pytest.mark.slow
def test_a_rollback_one_rank_asks_for_stops_every_rank_instead(project: Project) -> None:
    # a rollback is decided at a rank's own check: made by one rank alone it would leave the
    # replicas apart, so under torchrun it is a stop every rank agrees on (resumable)
    (project.path / "prudent.yaml").write_text(
        "monitor:\n  rules:\n    exploding_gradient: {action: [rollback]}\n"
        "    divergence: {action: [alert]}\n")
    project.env.update(EVERY_STEP)
    result = project.prudent("run", "--run-id", "rollback", "--",
                             *torchrun_command("ddp_spike_one_rank.py"), timeout=300)
    assert result.returncode == 3, result.stderr
    shown = project.show("rollback")
    assert shown["stop_reason"] == "rule:exploding_gradient"
    (stop,) = [e for e in shown["events"] if e["name"] == "stop_requested"]
    assert "no rollback under torchrun" in stop["message"]
    assert not (project.path / "replicas.txt").exists()  # stopped: never reached the end


@pytest.mark.slow
def test_a_tail_one_rank_meets_is_trained_on_every_rank_and_no_evidence_on_any(
        project: Project) -> None:
    # rank 1 alone meets a mislabelled batch every 40 steps: skipped on both ranks at first,
    # then trained on both as the run's own tail, and kept out of both ranks' evidence alike
    project.env.update(SPOIL="tail", STEPS="1000")
    result = project.prudent("run", "--run-id", "tail", "--",
                             *torchrun_command("ddp_spike_one_rank.py"), timeout=300)
    assert result.returncode == 0, result.stderr
    assert float((project.path / "replicas.txt").read_text()) == 0.0
    events = project.show("tail")["events"]
    skips = [e["step"] for e in events if e["name"] == "skipped_update"]
    (trained,) = [e for e in events if e["name"] == "outlier_trained"]
    assert skips and all((s - 150) % 40 == 0 for s in skips)  # the mislabelled batches only
    assert trained["step"] > skips[-1] and "heavy tail" in trained["message"]
    seen = [(project.path / f"tail-{rank}.txt").read_text().split() for rank in (0, 1)]
    assert seen[0] == seen[1] and str(trained["step"]) in seen[0]
