"""The monitor's statistics on FSDP2 (DTensor) parameters: global, and agreed by every rank."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from prudent.monitor import MonitorSettings
from prudent.monitor.shards import ShardedNorms
from prudent.monitor.stats import StepStats
from prudent.testing import tiny_model
from tests.fsdp2 import batch, one_rank_mesh, sharded_mlp, two_ranks

REL = 1e-6


def test_plain_parameters_take_the_plain_path() -> None:
    model = tiny_model()
    assert ShardedNorms.find(list(model.parameters())) is None
    stats = StepStats()
    stats.attach({"model": model})
    assert stats._shards is None


def _watched(model: torch.nn.Module, steps: int) -> list[Any]:
    """StepStats over ``steps`` steps of ``model`` (SGD, the same batches): its windows."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    stats = StepStats(MonitorSettings(grad_norm_every_steps=2, sample_every_steps=3,
                                      check_every_steps=10))
    stats.attach({"model": model, "optimizer": opt})
    windows = []
    for step in range(1, steps + 1):
        x, y = batch(step, 1)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        stats.after_backward(step)
        opt.step()
        opt.zero_grad()
        stats.step_end(step, loss)
        if step % 4 == 0:
            windows.append(stats.take_window())
    return windows


def test_one_rank_fsdp2_statistics_equal_the_plain_models(tmp_path: Path) -> None:
    with one_rank_mesh(tmp_path) as mesh:
        plain, sharded = sharded_mlp(mesh)
        got = _watched(sharded, 8)
    expected = _watched(plain, 8)
    for mine, theirs in zip(got, expected):
        assert mine.steps == theirs.steps
        assert [g is None for g in mine.grad_norm] == [g is None for g in theirs.grad_norm]
        assert [g for g in mine.grad_norm if g] == pytest.approx(
            [g for g in theirs.grad_norm if g], rel=REL)
        assert [s.step for s in mine.layers] == [s.step for s in theirs.layers]
        for a, b in zip(mine.layers, theirs.layers):
            assert a.grad_rms == pytest.approx(b.grad_rms, rel=REL)
            assert a.update_ratio == pytest.approx(b.update_ratio, rel=REL)
            assert a.layer_update_ratio == pytest.approx(b.layer_update_ratio, rel=REL)
    assert sum(len(w.layers) for w in got) == 2  # steps 3 and 6


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """Two FSDP2 ranks, 40 steps (one pair of processes for the module: most of their time
    goes to importing torch's compiler stack, which ``fully_shard`` pulls in)."""
    return two_ranks(tmp_path_factory.mktemp("ranks"), num_steps=40)


def test_two_ranks_measure_the_same_steps_and_the_global_norms_of_a_plain_model(
        ranks: list[dict[str, Any]]) -> None:
    measured = [_measured(report) for report in ranks]
    assert measured[0] == measured[1]  # the same steps, the same numbers, on both ranks
    steps = sorted(measured[0])
    assert 10 < len(steps) < 40  # sampled, not every step
    expected = {int(k): v for k, v in ranks[0]["expected"].items()}
    for step in steps:
        assert measured[0][step] == pytest.approx(expected[step]["grad_norm"], rel=REL)
    samples = [[s for w in report["windows"] for s in w["layers"]] for report in ranks]
    assert samples[0] == samples[1] and len(samples[0]) >= 4
    for sample in samples[0]:
        wanted = expected[sample["step"]]
        assert sample["grad_rms"] == pytest.approx(wanted["grad_rms"], rel=REL)
        assert sample["update_ratio"] == pytest.approx(wanted["update_ratio"], rel=REL)
        assert sample["layer_update_ratio"] == pytest.approx(wanted["layer_update_ratio"],
                                                             rel=REL)


def test_the_monitor_in_a_run_measures_and_samples_the_same_steps_on_both_ranks(
        ranks: list[dict[str, Any]]) -> None:
    seen = [report["monitored"] for report in ranks]
    assert seen[0] == seen[1]  # the rules saw the same norms and samples on both ranks
    assert len(seen[0]["norms"]) >= 10 and len(seen[0]["samples"]) >= 4
    assert all(ratio is not None and ratio > 0 for _, ratio in seen[0]["samples"])


def _measured(report: dict[str, Any]) -> dict[int, float]:
    return {step: norm for window in report["windows"]
            for step, norm in zip(window["steps"], window["grad_norm"]) if norm is not None}


def test_norms_over_two_mesh_dims_and_the_leaders_plan(ranks: list[dict[str, Any]]) -> None:
    for report in ranks:
        reduced = report["reduce_2d"]
        full = reduced["expected"]
        # sharded over both dims: summed; replicated: as it is; a plain tensor: this rank's
        assert reduced["norms"] == pytest.approx([full, 2 * full, 3 * full], rel=REL)
        assert reduced["agreed"] == [5.0, 1.0]  # rank 0's plan; the wishes summed
    assert math.isfinite(ranks[0]["reduce_2d"]["expected"])
