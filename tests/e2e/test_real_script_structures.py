"""Structures of real training scripts (torchvision's classification reference, accelerate's
no-trainer examples), each in a script of our own: killed with SIGTERM under
``prudent run --max-restarts 1`` after a given step, the resumed run ends with the weights of
one never interrupted. docs/real-scripts/ tells how the real scripts fared."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from tests.e2e.conftest import Project, script
from tests.e2e.test_resume import assert_identical


def _killed_and_reference(project: Project, name: str, term_at: int) -> tuple[dict, dict]:
    command = ["--", sys.executable, script(name)]
    reference = project.prudent("run", "--run-id", "ref", "--set", "out=ref.pt", *command)
    assert reference.returncode == 0, reference.stderr
    killed = project.prudent("run", "--run-id", "kill", "--max-restarts", "1", "--set",
                             f"term_at={term_at}", *command)
    assert killed.returncode == 0, killed.stderr
    assert "resumed from ckpt-" in killed.stderr, killed.stderr
    return (torch.load(project.path / "ref.pt", weights_only=True),
            torch.load(project.path / "final.pt", weights_only=True))


@pytest.mark.slow
def test_a_sampler_the_script_moves_with_set_epoch_resumes_mid_epoch_bit_identical(
        project: Project) -> None:
    reference, resumed = _killed_and_reference(project, "set_epoch_sampler.py", term_at=17)
    assert_identical(reference, resumed)


@pytest.mark.slow
def test_augmentation_drawn_in_loader_workers_resumes_mid_epoch_bit_identical(
        project: Project) -> None:
    """Skipped by index, the workers would augment the rest of the epoch with generators that
    had not loaded the skipped samples: the resume reads them through the workers instead."""
    reference, resumed = _killed_and_reference(project, "worker_augment.py", term_at=5)
    assert_identical(reference, resumed)


@pytest.mark.slow
def test_a_progress_logger_around_run_batches_resumes_mid_epoch_bit_identical(
        project: Project) -> None:
    reference, resumed = _killed_and_reference(project, "metric_logger_loop.py", term_at=11)
    assert_identical(reference, resumed)


@pytest.mark.slow
def test_accelerate_prepared_objects_resume_mid_epoch_bit_identical(project: Project) -> None:
    pytest.importorskip("accelerate")
    reference, resumed = _killed_and_reference(project, "accelerate_prepared.py", term_at=8)
    assert_identical(reference, resumed)


@pytest.mark.slow
def test_preflight_of_accelerate_prepared_objects_passes_every_check(project: Project) -> None:
    """An AcceleratedOptimizer is an Optimizer without Optimizer.__init__ (no step hooks):
    preflight watches the optimizer it wraps instead of crashing at run.attach."""
    pytest.importorskip("accelerate")
    result = project.prudent("preflight", "--json", "--", sys.executable,
                             script("accelerate_prepared.py"), timeout=600)
    document = json.loads(result.stdout)
    assert result.returncode == 0 and document["ok"], json.dumps(document["checks"], indent=1)
    assert {check["status"] for check in document["checks"]} == {"pass"}
