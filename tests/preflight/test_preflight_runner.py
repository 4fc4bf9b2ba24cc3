from __future__ import annotations

import pytest

from prudent.kernel.errors import ConfigError
from prudent.preflight.runner import PhaseResult, PreflightRunner, choose_stop_step


def smoke(epochs: list[int], status: str = "completed") -> PhaseResult:
    steps = [{"step": i + 1, "epoch": e, "index": 0, "loss": 1.0} for i, e in enumerate(epochs)]
    return PhaseResult("smoke", 0, 1.0, {"status": status, "steps": steps,
                                         "num_epochs": max(epochs) + 1, "batches": [{}]})


def test_the_resume_check_stops_mid_way_through_the_second_epoch() -> None:
    assert choose_stop_step(smoke([0] * 8 + [1] * 8)) == 12
    assert choose_stop_step(smoke([0] * 8 + [1])) == 8  # at the epoch boundary
    assert choose_stop_step(smoke([0] * 8)) == 3  # one epoch: before the first epoch's scan
    assert choose_stop_step(smoke([0] * 8, status="failed")) is None


def test_bad_arguments_are_refused_before_anything_runs() -> None:
    with pytest.raises(ConfigError, match="after '--'"):
        PreflightRunner([])
    with pytest.raises(ConfigError, match="--steps must be >= 2"):
        PreflightRunner(["python", "train.py"], steps=1)
    with pytest.raises(ConfigError, match="--timeout"):
        PreflightRunner(["python", "train.py"], timeout_s=0)


def test_an_iteration_loop_stops_where_the_stop_process_was_already_started() -> None:
    loop = PhaseResult("smoke", 0, 1.0, {"status": "completed", "num_epochs": None,
                                         "batches": [], "steps": smoke([0] * 16).record["steps"]})
    assert choose_stop_step(loop, preferred=12) == 12  # no second stop process
    assert choose_stop_step(loop, preferred=40) == 8  # past the end: the middle
