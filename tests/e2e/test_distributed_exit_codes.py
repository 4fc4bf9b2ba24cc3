"""`prudent run -- torchrun ...` exits with prudent's code for the job, not torchrun's 1: a
SIGTERM (the platform taking the machines) gives 75, a NaN on one rank gives 3."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import Project, torchrun_command


def torchrun(*args: str) -> list[str]:
    return [*torchrun_command("ddp_exit_codes.py"), *args]


@pytest.fixture
def ddp(project: Project) -> Project:
    project.env.update({"PRUDENT_CHECKPOINT_EVERY": "1000steps", "PRUDENT_CONSOLE": "off"})
    return project


def last_steps(project: Project) -> list[int]:
    """The last step each rank completed, from the rank<r>.log files the script writes."""
    return [int((project.path / f"rank{r}.log").read_text().split()[-1]) for r in (0, 1)]


def wait_for_steps(path: Path, supervisor: subprocess.Popen[str], steps: int) -> None:
    deadline = time.monotonic() + 120
    while not (path.exists() and len(path.read_text().split()) >= steps):
        assert supervisor.poll() is None, supervisor.communicate()[1]
        assert time.monotonic() < deadline, "training under torchrun did not start"
        time.sleep(0.05)


@pytest.mark.slow
def test_sigterm_to_prudent_run_over_torchrun_exits_75_preempted(ddp: Project) -> None:
    supervisor = subprocess.Popen(
        [sys.executable, "-m", "prudent", "run", "--run-id", "ddp", "--set", "step_s=0.05", "--",
         *torchrun()], cwd=ddp.path, env=ddp.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    wait_for_steps(ddp.path / "rank0.log", supervisor, 5)
    supervisor.send_signal(signal.SIGTERM)
    _, stderr = supervisor.communicate(timeout=120)
    assert supervisor.returncode == 75, stderr
    shown = ddp.show("ddp")
    assert (shown["status"], shown["stop_reason"], shown["exit_code"]) == ("stopped", "preempted", 75)
    rank0, rank1 = last_steps(ddp)
    assert rank0 == rank1 < 150  # both ranks stopped together, long before the end


@pytest.mark.slow
def test_nan_on_one_rank_stops_every_rank_and_prudent_run_exits_3(ddp: Project) -> None:
    # the ranks agree every step: with their ~0.2 s interval, a whole 150-step run of fast
    # steps can be one interval, and the stop then lands on the planned last step
    ddp.env["PRUDENT_RANKS_AGREE_EVERY_S"] = "0"
    result = ddp.prudent("run", "--run-id", "nan", "--set", "nan_rank1_at=7", "--", *torchrun(),
                         timeout=300)
    assert result.returncode == 3, result.stderr
    shown = ddp.show("nan")
    assert (shown["status"], shown["stop_reason"], shown["exit_code"]) == \
        ("stopped", "rule:non_finite", 3)
    # torchrun's ChildFailedError traceback is not the last word on the screen: the run's is
    assert result.stderr.strip().splitlines()[-1].startswith(
        "prudent | nan | stopped (rule:non_finite), exit 3: torchrun's ChildFailedError"), \
        result.stderr[-2000:]
    rank0, rank1 = last_steps(ddp)
    assert rank0 == rank1 < 150
    # the cause is on rank 1 (its batch at step 7), rank 0 sees only its consequence (NaN
    # gradients, then its own NaN loss at step 8): rank 1's firing and its failure bundle are
    # in the run's record, said to be rank 1's, and rank 0's own events once each
    events = shown["events"]
    (capture,) = [e for e in events if e["name"] == "written" and e["payload"].get("rank") == 1]
    assert capture["step"] == 7 and capture["message"].startswith("rank 1: loss is nan at step 7")
    assert capture["payload"]["path"].endswith("step-7-rank1")
    assert (ddp.path / capture["payload"]["path"]).is_dir()
    assert any(e["kind"] == "rule" and e["message"].startswith("rank 1: loss is NaN at step 7")
               for e in events)
    blind = [e for e in events if e["name"] == "blind" and "loss_not_decreasing" in e["message"]]
    assert len(blind) == 1, blind  # the same on both ranks: once


@pytest.mark.slow
def test_a_crash_on_rank_1_fails_the_run_with_exit_1_not_a_preemption(ddp: Project) -> None:
    """Rank 1's script raises: rank 0's collective then fails as if a machine had vanished.
    It is the crash it is (exit 1, failed, the rank and its error named), not a 75 that
    SLURM's requeue or SkyPilot's recovery would relaunch without end."""
    result = ddp.prudent("run", "--run-id", "crash", "--set", "crash_rank1_at=20", "--",
                         *torchrun(), timeout=300)
    assert result.returncode == 1, result.stderr
    shown = ddp.show("crash")
    assert (shown["status"], shown["stop_reason"], shown["exit_code"]) == ("failed", "error", 1)
    end = [e for e in shown["events"] if (e["kind"], e["name"]) == ("lifecycle", "end")]
    assert end[-1]["message"].startswith("rank 1: RuntimeError: boom on rank 1"), end
    assert "rank_lost" not in {e["name"] for e in shown["events"]}
