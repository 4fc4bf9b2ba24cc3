"""Shared fixtures. Every test fails if it leaks threads, environment variables or children."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from prudent.testing import make_settings
from prudent.wiring.config import ProjectSettings
from tests.postgres import pg_url, postgres  # noqa: F401 - fixtures for every test folder

# the tests' child processes exit without the interpreter's last garbage collections (see
# tests/_fast_exit/sitecustomize.py); set before any test snapshots the environment
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(Path(__file__).parent / "_fast_exit"), *filter(None, [os.environ.get("PYTHONPATH")])])
# and they keep compiled bytecode (__pycache__, ignored by git): with PYTHONDONTWRITEBYTECODE
# set, as on these machines, each one compiled prudent's ~120 modules again (0.4 s of CPU)
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

# Threads and processes meant to live as long as the test session: fsspec's shared IO loop,
# and servers or browsers started by session fixtures (which register theirs here; a process's
# descendants are the session's too).
SESSION_THREADS: set[threading.Thread] = set()
SESSION_PIDS: set[int] = set()
_SESSION_THREAD_NAMES = ("fsspecIO", "asyncio_")


def _is_session_thread(thread: threading.Thread) -> bool:
    return thread in SESSION_THREADS or thread.name.startswith(_SESSION_THREAD_NAMES)


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """A real S3-compatible server (moto's) on loopback, for the object-storage tests."""
    moto_server = pytest.importorskip("moto.server")
    pytest.importorskip("s3fs")
    before = set(threading.enumerate())
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    SESSION_THREADS.update(set(threading.enumerate()) - before)
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture(autouse=True)
def no_leaks() -> Iterator[None]:
    env_before = _environment()
    threads_before = set(threading.enumerate())
    yield
    assert _environment() == env_before, "the test changed os.environ without restoring it"
    deadline = time.monotonic() + 5
    while True:
        leaked = [t for t in threading.enumerate()
                  if t not in threads_before and t.is_alive() and not _is_session_thread(t)]
        if not leaked or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert not leaked, f"threads left running: {[t.name for t in leaked]}"
    children = psutil.Process().children(recursive=True)
    if SESSION_PIDS:  # a session server's own children (a browser's renderers) come and go
        SESSION_PIDS.update(p.pid for p in children if _parent_in_session(p))
        children = [p for p in children if p.pid not in SESSION_PIDS and p.is_running()]
    for child in children:
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass  # it ended on its own meanwhile: still a process the test left behind
    assert not children, f"child processes left running: {children}"


def _parent_in_session(process: psutil.Process) -> bool:
    try:
        return any(parent.pid in SESSION_PIDS for parent in process.parents())
    except psutil.Error:
        return False


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
