"""Turning process signals into clean stops.

SIGTERM is what Kubernetes, SageMaker and a spot machine's shutdown send before the kill, and
SIGUSR1 what SLURM sends ahead of time with ``--signal=USR1@120``; prudent makes either a stop
request with reason ``preempted`` (checked at the next step or batch, where the checkpointer
saves), so the run unwinds through ``with run:`` instead of dying mid-write. A handler the
script installed itself is left alone.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from typing import Any

from prudent.kernel.stop import StopKind, StopReason

__all__ = ["SignalStopper"]


class SignalStopper:
    def __init__(self, request_stop: Callable[[str, str], None]) -> None:
        self._request_stop = request_stop
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # Python only lets the main thread set handlers
        for signum in (signal.SIGTERM, signal.SIGUSR1):
            if signal.getsignal(signum) in (signal.SIG_DFL, None):
                self._previous[signum] = signal.signal(signum, self._handle)

    def uninstall(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()

    def _handle(self, signum: int, _frame: Any) -> None:
        name = signal.Signals(signum).name
        self._request_stop(StopReason(StopKind.PREEMPTED, None,
                                       f"{name} received: stopping at the next step"))
