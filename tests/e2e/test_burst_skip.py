"""exploding_gradient's skip in real processes: a burst of bad batches has every update
skipped by its gradient norm, the first one included, and a run killed (SIGTERM) before or
after the burst and resumed ends bit-identical to the run that was never stopped."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from prudent.store.database import Store
from tests.e2e.conftest import SCRIPTS, Project

pytestmark = pytest.mark.slow

# loss_spike off: the gradient norm alone decides which updates are skipped
SETTINGS = {"monitor": {"rules": {"loss_spike": {"enabled": False}}}}
BURST = {"BURST_ONSET": "300", "BURST_LENGTH": "3", "BURST_SCALE": "50"}


def train(root: Path, run_id: str, **env: str) -> tuple[Project, Any]:
    project = Project(root)
    project.path.mkdir(exist_ok=True)
    (project.path / "prudent.yaml").write_text(json.dumps(SETTINGS))
    project.env.update(PRUDENT_RUN_ID=run_id, **BURST, **env)
    result = project.python(str(SCRIPTS / "burst_train.py"), timeout=300)
    return project, result


def skips(project: Project, run_id: str) -> list[tuple[int, str, str]]:
    store = Store(f"sqlite:///{project.path / '.prudent' / 'prudent.db'}")
    try:
        return [(e["step"], e["payload"]["rule"], e["message"]) for e in store.events(run_id)
                if e["name"] == "skipped_update"]
    finally:
        store.close()


def weights(project: Project) -> dict[str, Any]:
    return torch.load(project.path / "final.pt", weights_only=True)


def assert_identical(a: dict[str, Any], b: dict[str, Any]) -> None:
    for part in ("model", "optimizer"):
        flat_a, flat_b = _tensors(a[part]), _tensors(b[part])
        assert flat_a.keys() == flat_b.keys()
        for key in flat_a:
            assert torch.equal(flat_a[key], flat_b[key]), f"{part}.{key} differs"


def _tensors(value: Any, prefix: str = "") -> dict[str, torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return {prefix: value}
    if isinstance(value, dict):
        return {k: v for key, item in value.items() for k, v in _tensors(item, f"{prefix}.{key}").items()}
    if isinstance(value, (list, tuple)):
        return {k: v for i, item in enumerate(value) for k, v in _tensors(item, f"{prefix}[{i}]").items()}
    return {}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Project, Any]:
    return train(tmp_path_factory.mktemp("whole"), "whole")


def test_every_update_of_a_burst_is_skipped_by_its_gradient_norm(
        uninterrupted: tuple[Project, Any]) -> None:
    project, result = uninterrupted
    assert result.returncode == 0, result.stderr[-3000:]
    assert [(step, rule) for step, rule, _ in skips(project, "whole")] == [
        (300, "exploding_gradient"), (301, "exploding_gradient"), (302, "exploding_gradient")]
    assert "COMPLETED" in result.stdout


@pytest.mark.parametrize("kill_at", [200, 350])
def test_a_run_killed_before_or_after_the_burst_resumes_bit_identical(
        tmp_path: Path, uninterrupted: tuple[Project, Any], kill_at: int) -> None:
    whole, _ = uninterrupted
    project, killed = train(tmp_path, "killed", BURST_KILL_AT=str(kill_at))
    assert killed.returncode != 0 and "COMPLETED" not in killed.stdout, killed.stderr[-3000:]
    assert not (project.path / "final.pt").exists()
    project, resumed = train(tmp_path, "killed")  # the same run id: it resumes
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resum" in (resumed.stdout + resumed.stderr).lower()
    assert skips(project, "killed") == skips(whole, "whole")
    assert_identical(weights(project), weights(whole))
