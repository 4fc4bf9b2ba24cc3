"""SystemSampler: a thread that samples the machine and stops cleanly; GPUs are optional."""

from __future__ import annotations

import sys
import threading
import time

import pytest

from prudent.profile.gpu import INSTALL_HINT, GpuReader
from prudent.profile.sampler import SystemSampler


def test_sampler_records_system_use_and_throughput_then_stops() -> None:
    progress = {"steps": 0}
    sampler = SystemSampler(0.02, lambda: (progress["steps"], 32 * progress["steps"], 0.0))
    sampler.start()
    for _ in range(20):
        progress["steps"] += 5
        time.sleep(0.01)
    sampler.stop()
    assert not [t for t in threading.enumerate() if t.name == "prudent-profile-sampler"]
    samples = sampler.samples
    assert len(samples) >= 3 and samples[-1]["step"] == 100
    assert all(s["rss_mb"] > 10 and s["cpu_pct"] >= 0 for s in samples)
    rates = [s["samples_per_s"] / s["steps_per_s"] for s in samples if s["steps_per_s"]]
    assert rates and all(r == pytest.approx(32) for r in rates)
    assert [s["t"] for s in samples] == sorted(s["t"] for s in samples)


def test_stop_without_start_is_harmless() -> None:
    sampler = SystemSampler(1.0, lambda: (0, 0, 0.0))
    sampler.stop()
    assert sampler.samples == []


def test_missing_nvidia_ml_py_is_quiet_and_says_which_extra(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # as if nvidia-ml-py were not installed
    reader = GpuReader()
    assert reader.num_gpus == 0 and reader.read() == []
    assert reader.note == INSTALL_HINT and "prudent[gpu]" in reader.note
    reader.close()
