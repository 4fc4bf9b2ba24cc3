"""A real MLflow tracking server for the tests: ``mlflow server`` with a SQLite backend and a
local artifact folder, on loopback and a free port, started once per session (it takes ~20 s
to start on two cores) and torn down after. No mlflow installed: the tests that need it skip."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

__all__ = ["MLFLOW_ENV", "mlflow_server"]

# no network in the tests: MLflow's usage telemetry would wait ~20 s at every process's exit
MLFLOW_ENV = {"MLFLOW_DISABLE_TELEMETRY": "true", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0"}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="session")
def mlflow_server() -> Iterator[str]:
    """The server's URL."""
    pytest.importorskip("mlflow")
    from tests.conftest import SESSION_PIDS

    root = Path(tempfile.mkdtemp(prefix="prudent-mlflow-"))
    port = _free_port()
    log = (root / "server.log").open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri",
         f"sqlite:///{root / 'mlflow.db'}", "--artifacts-destination", str(root / "artifacts"),
         "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
        env={**os.environ, **MLFLOW_ENV}, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True)
    SESSION_PIDS.add(process.pid)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, process, root)
        yield url
    finally:
        os.killpg(process.pid, 15)
        process.wait(timeout=30)
        log.close()
        shutil.rmtree(root, ignore_errors=True)


def _wait_healthy(url: str, process: subprocess.Popen[bytes], root: Path) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert process.poll() is None, (root / "server.log").read_text()[-2000:]
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=1) as answer:
                if answer.status == 200:
                    return
        except OSError:
            time.sleep(0.25)
    raise AssertionError(f"mlflow server did not start: {(root / 'server.log').read_text()[-2000:]}")
