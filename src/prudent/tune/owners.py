"""Who holds a trial on this machine: a worker process, known by its pid and start time.

A worker writes ``{"host", "pid", "created"}`` into the trial it runs; another worker on the
same host tells a live owner from a dead one (or from a reused pid) with these. Across
machines, liveness is Optuna's heartbeat instead (:mod:`prudent.tune.machines`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prudent.launch.spec import ENV_RUN_ID

__all__ = ["created_at", "owner_alive", "pid_runs"]


def created_at(pid: int) -> float | None:
    """When process ``pid`` started (None if it is gone): with the pid, it names the process."""
    import psutil

    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def owner_alive(owner: Mapping[str, Any]) -> bool:
    """The worker ``owner`` (pid and start time) still runs on this host."""
    import psutil

    try:
        return psutil.Process(int(owner["pid"])).create_time() == owner.get("created")
    except (psutil.Error, KeyError, TypeError, ValueError):
        return False


def pid_runs(pid: int, run_id: str) -> bool:
    """The process ``pid`` is alive and is that run's (not a reused pid)."""
    import psutil

    try:
        process = psutil.Process(int(pid))
        return process.status() != psutil.STATUS_ZOMBIE and process.environ().get(
            ENV_RUN_ID) == run_id
    except (psutil.Error, OSError):
        return False
