"""Rules on the process: memory that keeps climbing, and a loop that stopped moving."""

from __future__ import annotations

from collections import deque
from typing import Any

from pydantic import Field, field_validator

from prudent.monitor.base import (
    ActionName,
    Finding,
    MemorySample,
    Rule,
    RuleSettings,
    Window,
    action_default,
    warmup_default,
)
from prudent.units import parse_duration_s

__all__ = ["MemoryGrowthRule", "StalledRule"]

_MB = 1 << 20


class MemoryGrowthSettings(RuleSettings):
    action: list[ActionName] = action_default("alert")
    warmup_steps: int = warmup_default(100)
    window: int = Field(10, ge=3, description="Memory samples compared (one every "
                        "monitor.sample_every_steps, so 1000 steps by default).")
    min_growth_mb: float = Field(64.0, gt=0, description="Fire when host RSS or device memory "
                                 "grew by at least this many MB across the window...")
    steady_fraction: float = Field(0.8, gt=0, le=1, description="...and rose between at least "
                                   "this fraction of consecutive samples (a leak climbs; a cache "
                                   "that fills once does not).")


class MemoryGrowthRule(Rule):
    """Host RSS or device memory climbs steadily from step to step: tensors kept alive (a loss
    appended with its graph, a growing list of outputs) end in an out-of-memory crash hours
    later. SageMaker's GPUMemoryIncrease compares two moving averages of GPU memory only."""

    name = "memory_growth"
    needs = frozenset({"memory"})
    Settings = MemoryGrowthSettings
    settings: MemoryGrowthSettings
    state_fields = ("host", "device")

    def __init__(self, settings: MemoryGrowthSettings | None = None) -> None:
        super().__init__(settings)
        self.host: deque[list[int]] = deque(maxlen=self.settings.window)
        self.device: deque[list[int]] = deque(maxlen=self.settings.window)

    def check(self, window: Window) -> Finding | None:
        return self.first_finding(window.memory, self._judge)

    def _judge(self, sample: MemorySample) -> Finding | None:
        if not self.active_at(sample.step):
            return None
        for label, series, value in (("host memory (RSS)", self.host, sample.host_bytes),
                                     ("device memory", self.device, sample.device_bytes)):
            if value is None:
                continue
            series.append([sample.step, int(value)])
            finding = self._growth(label, series)
            if finding is not None:
                return finding
        return None

    def _growth(self, label: str, series: deque[list[int]]) -> Finding | None:
        s = self.settings
        if len(series) < s.window:
            return None
        (first_step, first), (last_step, last) = series[0], series[-1]
        rises = sum(b[1] > a[1] for a, b in zip(series, list(series)[1:]))
        steady = rises / (len(series) - 1)
        if last - first < s.min_growth_mb * _MB or steady < s.steady_fraction:
            return None
        per_step = (last - first) / max(1, last_step - first_step)
        return Finding(last_step, last / _MB, first / _MB + s.min_growth_mb, (
            f"{label} grew by {(last - first) / _MB:.0f} MB between step {first_step} and "
            f"step {last_step} ({per_step / 1024:.0f} kB per step, rising in {steady:.0%} of samples; "
            f"now {last / _MB:.0f} MB): tensors kept alive across steps? (threshold "
            f"{s.min_growth_mb:g} MB)"))


class StalledSettings(RuleSettings):
    timeout_s: float = Field(900.0, gt=0, description="No step, batch or log for this long: the "
                             "loop is stuck (\"15min\", \"90s\" or seconds; SageMaker's "
                             "StalledTrainingRule waits 30 min and does not stop by default).")
    startup_timeout_s: float = Field(1800.0, gt=0, description="The same before the first step "
                                     "(loading data, compiling the model).")
    grace_s: float = Field(60.0, gt=0, description="With action stop: how long the loop gets to "
                           "reach its next stop check before prudent interrupts it (SIGUSR2 to "
                           "the main thread); after twice this, the process exits with code 3.")

    @field_validator("timeout_s", "startup_timeout_s", "grace_s", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> float:
        return parse_duration_s(value)


class StalledRule(Rule):
    """No progress for ``timeout_s``: every thread's stack goes to
    ``<run dir>/stalled-stacks.txt``, then the action runs. The clock is watched by a thread
    (``prudent.monitor.watchdog``), so this rule judges idle time rather than windows."""

    name = "stalled"
    needs: frozenset[str] = frozenset()  # judged by the watchdog's clock
    Settings = StalledSettings
    settings: StalledSettings

    def check(self, window: Window) -> Finding | None:
        return None  # the watchdog thread calls check_idle

    def check_idle(self, idle_s: float, step: int, started: bool) -> Finding | None:
        limit = self.settings.timeout_s if started else self.settings.startup_timeout_s
        if idle_s < limit:
            return None
        where = f"after step {step}" if started else "before the first step"
        return Finding(step, idle_s, limit, (
            f"training stalled: no step for {idle_s:.3g} s {where} (timeout {limit:g} s); "
            "stacks of every thread in stalled-stacks.txt"))
