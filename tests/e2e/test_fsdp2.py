"""FSDP2 (`fully_shard`, DTensor parameters) under torchrun on gloo: the guardrails measure
global numbers with every rank making the same collectives, and a NaN on one rank stops all.
Checkpoints are off: saving FSDP2 state is another test's."""

from __future__ import annotations

import sys

import pytest
import torch

from tests.e2e.conftest import Project, script


def torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
            script("fsdp2_train.py"), *args]


@pytest.fixture
def fsdp2(project: Project) -> Project:
    project.env.update({"PRUDENT_CHECKPOINT_EVERY": "off", "PRUDENT_CONSOLE": "off"})
    # no save at an epoch's end or a stop either; any measured gradient norm is "above
    # max_norm": each alert records the monitor's global norm at its step
    (project.path / "prudent.yaml").write_text(
        "checkpoint: {at_epoch_end: false, on_stop: false}\n"
        "monitor:\n  rules:\n    exploding_gradient: {max_norm: 1.0e-9, action: alert, "
        "warmup_steps: 0, cooldown_steps: 10}\n")
    return project


def logged(project: Project, rank: int) -> dict[int, float]:
    """Step -> torch's global gradient norm, for each step the rank completed."""
    lines = (project.path / f"rank{rank}.log").read_text().splitlines()
    return {int(step): float(norm) for _, step, norm in map(str.split, lines)}


@pytest.mark.slow
def test_fsdp2_run_completes_with_the_global_gradient_norm_in_its_record(fsdp2: Project) -> None:
    result = fsdp2.prudent("run", "--run-id", "fsdp2", "--", *torchrun(), timeout=300)
    assert result.returncode == 0, result.stderr
    shown = fsdp2.show("fsdp2")
    assert (shown["status"], shown["step"]) == ("completed", 100)
    expected = logged(fsdp2, 0)
    assert sorted(expected) == sorted(logged(fsdp2, 1)) == list(range(1, 101))
    alerts = [e for e in shown["events"] if (e["kind"], e["name"]) == ("rule", "exploding_gradient")]
    assert len(alerts) >= 5  # one every cooldown_steps, at a step whose norm was measured
    for alert in alerts:
        norm = alert["payload"]["value"]
        assert norm == pytest.approx(expected[alert["step"]], rel=1e-6), alert["message"]


@pytest.mark.slow
def test_nan_on_one_fsdp2_rank_stops_every_rank(fsdp2: Project) -> None:
    result = fsdp2.prudent("run", "--run-id", "nan", "--set", "nan_rank1_at=30", "--",
                           *torchrun(), timeout=300)
    shown = fsdp2.show("nan")
    assert (shown["status"], shown["stop_reason"]) == ("stopped", "rule:non_finite"), result.stderr
    last = [max(logged(fsdp2, rank)) for rank in (0, 1)]
    # together, at the ranks' next agreement (about 0.2 s of training later; at the planned
    # last step at the latest)
    assert last[0] == last[1] and 30 <= last[0] <= 100
    bundle = fsdp2.path / ".prudent" / "runs" / "nan" / "captures" / "step-30-rank1"
    weights = torch.load(bundle / "object-model.pt", weights_only=True)  # no DTensor: loadable
    assert weights["0.weight"].shape == (16, 8)  # rank 1's shard of the 32 x 8 weight
