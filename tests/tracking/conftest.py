from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.mlflow_server import MLFLOW_ENV, mlflow_server  # noqa: F401 - the session's server


@pytest.fixture(autouse=True)
def quiet_mlflow(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No network here: MLflow's telemetry off, and no retrying a server that is down."""
    for name, value in MLFLOW_ENV.items():
        monkeypatch.setenv(name, value)
    yield


@pytest.fixture
def wandb_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """W&B offline, quiet, writing under the test's folder: nothing reaches the network
    (WANDB_MODE=offline also keeps W&B's own usage analytics off). W&B's service process, its
    threads and the variable it sets (WANDB_SERVICE) end with the test."""
    wandb = pytest.importorskip("wandb")
    folder = tmp_path / "wandb-dir"
    folder.mkdir()
    for name, value in {"WANDB_MODE": "offline", "WANDB_SILENT": "true",
                        "WANDB_DIR": str(folder)}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("WANDB_SERVICE", raising=False)  # restored (absent) after the test
    yield folder
    wandb.teardown()
