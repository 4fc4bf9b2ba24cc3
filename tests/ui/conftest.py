"""Fixtures for the report and dashboard tests: a store of real runs, a real ``prudent ui``
server, and Debian's Chromium driven by Playwright.

Playwright's own browser download is not reachable here: the browser is the system's
``chromium`` (``apt-get install chromium``; ``.ci/run`` installs it). Without it the browser
tests skip, except under ``CI`` where they fail, as the PostgreSQL tests do.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.conftest import SESSION_PIDS

SCRIPT = str(Path(__file__).parent / "scripts" / "train.py")
NAN_AT = 150  # the nan run's poisoned step: the non_finite rule fires at the step after it
XSS_NAME = "<script>alert(1)</script>"
XSS_NOTE = "<img src=x onerror=alert(2)>"


def chromium_path() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def unavailable(reason: str, module: bool = False) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"browser tests cannot run under CI: {reason}", pytrace=False)
    pytest.skip(f"browser tests skipped: {reason}", allow_module_level=module)


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args: dict[str, Any]) -> dict[str, Any]:
    """pytest-playwright's browser, launched from Debian's Chromium."""
    path = chromium_path()
    if path is None:
        unavailable("no chromium on PATH (apt-get install chromium)")
    return {**browser_type_launch_args, "executable_path": path,
            "args": ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"]}


@pytest.fixture(scope="session")
def browser(browser: Any) -> Any:
    """The session's browser; its processes are the session's, not a test's leak."""
    SESSION_PIDS.update(p.pid for p in psutil.Process().children(recursive=True))
    return browser


def project_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRUDENT_")}
    return env | {"PRUDENT_HOME": str(home / ".prudent"), "PRUDENT_CONSOLE": "plain"}


def prudent(home: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "prudent", *args], cwd=home,
                          env=project_env(home), capture_output=True, text=True, timeout=timeout)


def start_run(home: Path, run_id: str, *args: str) -> subprocess.Popen[str]:
    """``prudent run`` of the tiny training script, in the background."""
    return subprocess.Popen([sys.executable, "-m", "prudent", "run", "--run-id", run_id, *args,
                             "--", sys.executable, SCRIPT], cwd=home, env=project_env(home),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.fixture(scope="session")
def runs_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project with four finished runs: completed, stopped by a rule, failed, and one whose
    name and config carry markup."""
    home = tmp_path_factory.mktemp("ui-runs")
    steps = ["--set", "steps=200"]
    started = [start_run(home, "ok", *steps),
               start_run(home, "nan", *steps, "--set", f"nan_at={NAN_AT}"),
               start_run(home, "crash", *steps, "--set", "crash_at=120"),
               start_run(home, "xss", "--name", XSS_NAME, "--set", f"note={XSS_NOTE}", *steps)]
    for process in started:
        _, err = process.communicate(timeout=240)
        assert "database is locked" not in err, err
    return home


class UiServer:
    """A real ``prudent ui`` on a free loopback port."""

    def __init__(self, home: Path, *args: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "prudent", "ui", "--port", str(self.port), *args], cwd=home,
            env=project_env(home), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                self.get_json("/api/runs")
                return
            except OSError:
                if self.process.poll() is not None:
                    raise AssertionError(f"prudent ui exited: {self.process.stderr.read()}") \
                        from None
                time.sleep(0.2)
        raise AssertionError("prudent ui did not answer within 60 s")

    def get_json(self, path: str) -> Any:
        with urllib.request.urlopen(self.url + path, timeout=10) as response:
            return json.loads(response.read())

    def stop(self) -> str:
        self.process.terminate()
        _, err = self.process.communicate(timeout=30)
        return err


@pytest.fixture(scope="session")
def ui(runs_home: Path) -> Iterator[UiServer]:
    server = UiServer(runs_home)
    SESSION_PIDS.add(server.process.pid)
    yield server
    server.stop()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="session")
def screenshots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the tests write a screenshot of each page (PRUDENT_SCREENSHOTS to keep them)."""
    folder = os.environ.get("PRUDENT_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        return Path(folder)
    return tmp_path_factory.mktemp("screenshots")
