from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.mlflow_server import MLFLOW_ENV, mlflow_server  # noqa: F401 - the session's server


@pytest.fixture(autouse=True)
def quiet_mlflow(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No network here: MLflow's telemetry off, and no retrying a server that is down."""
    for name, value in MLFLOW_ENV.items():
        monkeypatch.setenv(name, value)
    yield
