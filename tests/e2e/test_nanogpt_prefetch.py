"""nanoGPT's own loop shape (scripts/nanogpt_prefetch.py): the next batch drawn after the
forward pass and kept across run.step() with run.carry, the evaluation at the top of an
iteration on the global generator, dropout on. A machine that vanishes right after early
stopping kept a checkpoint from inside run.log resumes from that checkpoint and ends
bit-identical to the run that was never interrupted."""

from __future__ import annotations

import json
import re
import sys

import pytest
import torch

from tests.e2e.conftest import Project, script
from tests.e2e.test_resume import assert_identical

PREFETCH = script("nanogpt_prefetch.py")


# NumPy's and Python's generators are read at the boundary an evaluation is foreseen after
# (from the last two evaluations' spacing): without that, a keep held them as the evaluation
# left them, and the resumed run drew other batches
@pytest.mark.parametrize("draws", ["torch", "numpy", "python"])
def test_resumed_from_a_checkpoint_kept_inside_run_log_the_run_is_bit_identical(
        project: Project, draws: str) -> None:
    project.env.update({"PRUDENT_CHECKPOINT_EVERY": "off"})  # only early stopping's keeps
    (project.path / "prudent.yaml").write_text("checkpoint: {keep: 100}\n")  # all kept to read
    reference = project.prudent("run", "--run-id", "ref", "--set", "out=ref.pt", "--set",
                                f"draws={draws}", "--",
                                sys.executable, PREFETCH)
    assert reference.returncode == 0, reference.stderr
    killed = project.prudent("run", "--run-id", "kill", "--max-restarts", "1", "--set",
                             "die_at=25", "--set", f"draws={draws}", "--", sys.executable,
                             PREFETCH)
    assert killed.returncode == 0, killed.stderr
    # the newest checkpoint is one early stopping kept at an evaluation (iteration 20's, as
    # a rule), after that evaluation drew its batches and with the next batch prefetched
    resumed = re.search(r"resumed from (ckpt-\d+): step (\d+) of 60", killed.stderr)
    assert resumed and int(resumed[2]) in (0, 10, 20), killed.stderr
    manifest = project.path / ".prudent/runs/kill/checkpoints" / resumed[1] / "manifest.json"
    assert json.loads(manifest.read_text())["reason"] == "keep:best"
    assert_identical(torch.load(project.path / "ref.pt"), torch.load(project.path / "final.pt"))
