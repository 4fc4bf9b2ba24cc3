"""SystemSampler: a background thread that records how busy the machine is.

Every ``interval_s`` it reads the process's and the system's CPU %, resident memory, disk and
network I/O (psutil), each visible GPU (NVML, when installed), the memory PyTorch holds on
the training device, and the training progress, so throughput over the last interval comes
for free, and where the interval's time went (data / compute / checkpoint / eval / other,
as shares of the time the step timer charged in it). The training thread does nothing for
it: the sampler reads the step timer's counters, which CPython updates atomically. About
0.1 ms of CPU per sample.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import psutil

from prudent.profile.gpu import GpuReader

__all__ = ["MAX_SAMPLES", "SystemSampler"]

MAX_SAMPLES = 2048  # beyond this, every other sample is dropped: a week-long run stays small
MB = 2**20

Progress = Callable[[], tuple[int, int, float]]  # (steps, samples, tokens) so far
DeviceMemory = Callable[[], tuple[float, float]]  # (allocated MB, reserved MB)
Split = Callable[[], dict[str, float]]  # seconds so far per step-time category (the timer's)


class SystemSampler:
    """Start it, stop it, read :attr:`samples` (a list of flat dicts, oldest first)."""

    def __init__(self, interval_s: float, progress: Progress,
                 clock: Callable[[], float] = time.monotonic, split: Split | None = None) -> None:
        self.interval_s = interval_s
        self.samples: list[dict[str, Any]] = []
        self.device_memory: DeviceMemory | None = None  # set once training is seen on CUDA
        # called with each new sample, on the sampler's thread (the profiler records it)
        self.on_sample: Callable[[dict[str, Any]], None] | None = None
        self._split = split
        self.gpu_note = ""
        self._progress = progress
        self._clock = clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._process = psutil.Process()
        self._gpus: GpuReader | None = None
        self._t0 = 0.0
        self._last: dict[str, float] = {}

    def start(self) -> None:
        self._gpus = GpuReader()
        self.gpu_note = self._gpus.note
        self._t0 = self._clock()
        self._process.cpu_percent(None)  # the first reading only primes the counters
        psutil.cpu_percent(None)
        self._last = self._counters()
        self._thread = threading.Thread(target=self._loop, name="prudent-profile-sampler",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread, take a last sample (so even a short run has one), release NVML."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join(timeout=10)
        self._thread = None
        self._sample()
        if self._gpus is not None:
            self._gpus.close()

    @property
    def num_gpus(self) -> int:
        return self._gpus.num_gpus if self._gpus is not None else 0

    def gpu_position(self, uuid: str) -> int | None:
        """Where the GPU with this UUID is in each sample's ``gpus`` list, if sampled."""
        return self._gpus.position(uuid) if self._gpus is not None else None

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self._sample()
            except Exception:  # a failed reading must never reach training
                continue

    def _sample(self) -> None:
        now = self._counters()
        elapsed = max(now["t"] - self._last["t"], 1e-9)
        rate = {key: (now[key] - self._last[key]) / elapsed for key in now if key != "t"}
        self._last = now
        sample: dict[str, Any] = {
            "t": round(now["t"] - self._t0, 3), "step": int(now["steps"]),
            "steps_per_s": rate["steps"], "samples_per_s": rate["samples"],
            "tokens_per_s": rate["tokens"], "cpu_pct": self._process.cpu_percent(None),
            "system_cpu_pct": psutil.cpu_percent(None),
            "rss_mb": self._process.memory_info().rss / MB,
            "disk_read_mb_s": rate["disk_read"] / MB, "disk_write_mb_s": rate["disk_write"] / MB,
            "net_recv_mb_s": rate["net_recv"] / MB, "net_sent_mb_s": rate["net_sent"] / MB,
        }
        if self._gpus is not None and self._gpus.num_gpus:
            sample["gpus"] = self._gpus.read()
        if self.device_memory is not None:
            sample["device_allocated_mb"], sample["device_reserved_mb"] = self.device_memory()
        # where the time charged in this interval went, in % of it: the timer charges time
        # at the loop's events, so an interval holds whole steps (one or two 15 ms steps in a
        # 20 ms interval: 75% or 150% of its wall time, and a last interval of 2 ms holding a
        # step read 750%); the shares of what was charged add up to 100
        categories = self._categories
        charged = sum(rate[f"split_{category}"] for category in categories)
        for category in categories:
            share = rate[f"split_{category}"] / charged if charged > 0 else 0.0
            sample[f"{category}_pct"] = 100 * share
        self.samples.append(sample)
        if len(self.samples) > MAX_SAMPLES:
            self.samples = self.samples[::2]
        if self.on_sample is not None:
            self.on_sample(sample)

    @property
    def _categories(self) -> list[str]:
        return [key.removeprefix("split_") for key in self._last if key.startswith("split_")]

    def _counters(self) -> dict[str, float]:
        steps, samples, tokens = self._progress()
        disk = _safe(psutil.disk_io_counters)
        net = _safe(psutil.net_io_counters)
        split = self._split() if self._split is not None else {}
        return {"t": self._clock(), "steps": steps, "samples": samples, "tokens": tokens,
                "disk_read": getattr(disk, "read_bytes", 0),
                "disk_write": getattr(disk, "write_bytes", 0),
                "net_recv": getattr(net, "bytes_recv", 0),
                "net_sent": getattr(net, "bytes_sent", 0),
                **{f"split_{category}": s for category, s in split.items()}}


def _safe(read: Callable[[], Any]) -> Any:
    """Containers may hide disk or network counters (psutil returns None or raises)."""
    try:
        return read()
    except Exception:
        return None
