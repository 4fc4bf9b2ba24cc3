"""Mixed precision with an enabled GradScaler, in real processes (tests/e2e/scripts/amp_train.py:
bf16 autocast on the CPU, gradients made infinite on chosen steps as an fp16 overflow makes
them): the scaler's skipped steps are its business, not a reason to stop, and its state comes
back with a checkpoint on a new machine."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import torch

from tests.e2e.conftest import Project, script, steps_trained, two_machines

TRAIN = [sys.executable, script("amp_train.py")]


def test_overflowing_steps_are_skipped_by_the_scaler_and_the_run_completes(
        project: Project) -> None:
    result = project.prudent("run", "--run-id", "amp", "--set", "overflow_at=[30, 31, 90]",
                             "--", *TRAIN, timeout=240)
    assert result.returncode == 0, result.stderr
    assert "DONE 200 scale 8192.0" in result.stdout  # halved at each of the 3 overflows
    run = project.show("amp")
    assert (run["status"], run["stop_reason"], run["step"]) == ("completed", None, 200)
    assert not [e for e in run["events"] if e["kind"] == "rule"]  # no rule fired on them
    assert not [e for e in run["events"] if e["name"] == "not_finite"]  # every save kept


def test_a_vanished_machine_resumes_with_the_scalers_state_to_identical_weights(
        tmp_path: Path, project: Project) -> None:
    old, new = two_machines(tmp_path, "every: 25steps")
    overflows = ["--set", "overflow_at=[30, 140]"]  # one before the checkpoint, one after
    reference = project.prudent("run", "--run-id", "ref", *overflows, "--set", "out=ref.pt",
                                "--", *TRAIN, timeout=240)
    assert reference.returncode == 0, reference.stderr
    cut = old.prudent("run", "--run-id", "spot", *overflows, "--set", "kill_at_step=120",
                      "--", *TRAIN, timeout=240)
    assert cut.returncode == 128 + signal.SIGKILL, cut.stderr
    again = new.prudent("run", "--run-id", "spot", *overflows, "--", *TRAIN, timeout=240)
    assert again.returncode == 0, again.stderr
    steps = steps_trained(new)
    assert steps[0] in (101, 76) and steps[-1] == 200  # from the newest checkpoint that landed
    final = torch.load(new.path / "final.pt", weights_only=True)
    expected = torch.load(project.path / "ref.pt", weights_only=True)
    assert final["scale"].item() == 16384.0  # the first overflow's halving came back too
    assert all(torch.equal(final[k], expected[k]) for k in expected)
