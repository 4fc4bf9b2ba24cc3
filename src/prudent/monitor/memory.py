"""memory_sample: the memory at one step, cheaply (the monitor takes one every few steps):
this process's resident memory, the host memory left for it and the device's."""

from __future__ import annotations

import math
import os
import time

from prudent.monitor.base import MemorySample

__all__ = ["memory_sample"]


class _ResidentMemory:
    """This process's resident memory, cheaply: on Linux one ``pread`` of
    ``/proc/self/statm`` on a descriptor kept open (~5 us inside a training loop, where
    psutil's open-read-parse takes ~150 us); psutil elsewhere. Reopened after a fork, since
    the descriptor names the process that opened it."""

    def __init__(self) -> None:
        self._pid = -1
        self._fd: int | None = None
        self._page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096

    def __call__(self) -> int:
        if self._pid != os.getpid():
            self._reopen()
        if self._fd is not None:
            try:
                return int(os.pread(self._fd, 128, 0).split()[1]) * self._page
            except (OSError, IndexError, ValueError):
                self._fd = None  # fall back to psutil from now on
        import psutil

        return int(psutil.Process().memory_info().rss)

    def _reopen(self) -> None:
        self._pid = os.getpid()
        self._fd = None
        if hasattr(os, "pread"):
            try:
                self._fd = os.open("/proc/self/statm", os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            except OSError:
                pass


_resident_bytes = _ResidentMemory()


class _AvailableMemory:
    """The host memory left for this process (``MemAvailable``, or a cgroup's limit minus its
    usage when that is tighter), read at most every few seconds: it only feeds a projection."""

    EVERY_S = 5.0

    def __init__(self) -> None:
        self._value: int | None = None
        self._read_at = -math.inf

    def __call__(self) -> int | None:
        now = time.monotonic()
        if now - self._read_at >= self.EVERY_S:
            self._read_at = now
            self._value = _read_available()
        return self._value


def _read_available() -> int | None:
    try:
        import psutil

        available = int(psutil.virtual_memory().available)
    except Exception:  # noqa: BLE001 - a projection without it is still a finding
        return None
    try:
        limit = open("/sys/fs/cgroup/memory.max").read().strip()  # noqa: SIM115
        used = int(open("/sys/fs/cgroup/memory.current").read())  # noqa: SIM115
        if limit != "max":
            available = min(available, int(limit) - used)
    except (OSError, ValueError):
        pass
    return available


_available_bytes = _AvailableMemory()


def memory_sample(step: int) -> MemorySample:
    """The memory now, for ``step`` (the device's only once CUDA is initialised)."""
    import torch

    device = total = None
    if torch.cuda.is_initialized():  # not available -> not initialised; and the cheaper test
        device = int(torch.cuda.memory_allocated())
        total = int(torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory)
    return MemorySample(step, _resident_bytes(), device, time.monotonic(), _available_bytes(),
                        total)
