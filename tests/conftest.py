"""Shared fixtures. Every test fails if it leaks threads, environment variables or children."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from prudent.config import ProjectSettings
from prudent.testing import make_settings


@pytest.fixture(autouse=True)
def no_leaks() -> Iterator[None]:
    env_before = _environment()
    threads_before = set(threading.enumerate())
    yield
    assert _environment() == env_before, "the test changed os.environ without restoring it"
    deadline = time.monotonic() + 5
    while True:
        leaked = [t for t in threading.enumerate() if t not in threads_before and t.is_alive()]
        if not leaked or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert not leaked, f"threads left running: {[t.name for t in leaked]}"
    children = psutil.Process().children(recursive=True)
    for child in children:
        child.kill()
    assert not children, f"child processes left running: {children}"


def _environment() -> dict[str, str]:
    # torch sets TORCHINDUCTOR_CACHE_DIR itself the first time an optimizer is built
    return {k: v for k, v in os.environ.items()
            if k not in ("PYTEST_CURRENT_TEST", "TORCHINDUCTOR_CACHE_DIR")}


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A clean project folder as the working directory, with PRUDENT_HOME inside it."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PRUDENT_HOME", str(tmp_path / ".prudent"))
    monkeypatch.setenv("PRUDENT_CONSOLE", "off")
    for var in ("PRUDENT_RUN_ID", "PRUDENT_SET", "PRUDENT_SUPERVISED", "PRUDENT_CONFIG",
                "PRUDENT_STORE_URL", "PRUDENT_RUN_NAME", "PRUDENT_DEVICE", "PRUDENT_SMOKE"):
        monkeypatch.delenv(var, raising=False)
    return tmp_path / ".prudent"


@pytest.fixture
def settings(home: Path) -> ProjectSettings:
    return make_settings(home)
