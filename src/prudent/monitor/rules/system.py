"""Rules on the process: memory that keeps climbing, and a loop that stopped moving."""

from __future__ import annotations

from collections import deque
from typing import Any

from pydantic import Field, field_validator

from prudent.kernel.units import parse_duration_s
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

__all__ = ["MemoryGrowthRule", "StalledRule"]

_MB = 1 << 20
_START_UP_STEPS = 50  # samples from before this step are not projected (a run's start-up)
_LAST_STRETCH = 0.2  # the part of a planned run where growth that will not crash it is let be
_SOON_MB = 8  # the least growth a finding reports (below min_growth_mb: an OOM projected soon)


class MemoryGrowthSettings(RuleSettings):
    action: list[ActionName] = action_default("stop")
    warmup_steps: int = warmup_default(100)
    window: int = Field(10, ge=3, description="Memory samples compared (one every "
                        "monitor.sample_every_steps, more often on a short run, and at least "
                        "every monitor.memory_every_s).")
    min_growth_mb: float = Field(64.0, gt=0, description="Fire when host RSS or device memory "
                                 "grew by at least this many MB across the window...")
    steady_fraction: float = Field(0.8, gt=0, le=1, description="...and rose between at least "
                                   "this fraction of consecutive samples (a leak climbs; a cache "
                                   "that fills once does not).")
    horizon_s: float = Field(1800.0, gt=0, description="Also fire, whatever the growth so far, "
                             "when the steady growth would exhaust the memory left (host: "
                             "available memory; device: its total) within this long "
                             "(\"30min\", \"2h\" or seconds).")

    @field_validator("horizon_s", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> float:
        return parse_duration_s(value)


class MemoryGrowthRule(Rule):
    """Host RSS or device memory climbs steadily from step to step: tensors kept alive (a loss
    appended with its graph, a growing list of outputs) end in an out-of-memory crash hours
    later. The message projects when, from the measured slope and the memory left.
    SageMaker's GPUMemoryIncrease compares two moving averages of GPU memory only."""

    name = "memory_growth"
    needs = frozenset({"memory"})
    Settings = MemoryGrowthSettings
    settings: MemoryGrowthSettings
    state_fields = ("host", "device")

    def __init__(self, settings: MemoryGrowthSettings | None = None) -> None:
        super().__init__(settings)
        self.host: deque[list[float]] = deque(maxlen=self.settings.window)
        self.device: deque[list[float]] = deque(maxlen=self.settings.window)
        self._planned: int | None = None  # the run's planned steps and step time (the window)
        self._step_s: float | None = None

    def fit(self, planned_steps: int) -> str | None:
        # samples every ~1% of the run (StepStats.fit): 12 of them span an eighth of it. The
        # warm-up stays a twentieth: a hundredth (one sample) stopped a healthy tiny BERT
        # under the Hugging Face Trainer at step 51 (RSS +9 MB over its first 50 steps, rising
        # in 9 of 10 samples, checkpoints every 10 steps), where the benchmark's scripts grow
        # at most 1.4 MB
        self.sized(planned_steps, warmup_steps=min(100, planned_steps // 20),
                   window=12 if planned_steps < 10_000 else 10)
        for name in ("host", "device"):
            setattr(self, name, deque(getattr(self, name), maxlen=self.settings.window))
        return None

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # a resumed run is sized again at its first check: until then keep every sample saved
        # (the window it was sized to may be longer than the default)
        for name in ("host", "device"):
            saved = state.get(name) or []
            setattr(self, name, deque(saved, maxlen=max(self.settings.window, len(saved))))
        super().load_state_dict({k: v for k, v in state.items() if k not in ("host", "device")})

    def check(self, window: Window) -> Finding | None:
        self._planned, self._step_s = window.planned_steps, window.step_s
        return self.first_finding(window.memory, self._judge)

    def _ends_first(self, step: float, to_oom: float | None) -> bool:
        """In the last ``_LAST_STRETCH`` of a planned run, the run ends before the projected
        out-of-memory error: stopping would save less than that stretch and cost the run its
        end, for growth that will not crash it (a 72-step run's start-up growth, 8 MB in
        0.6 s, projected an OOM in 28 min and stopped it at step 65; a tiny BERT under the
        Trainer at step 51 of 60). A leak is judged within the first tenth of a run."""
        planned, step_s = self._planned, self._step_s
        if not planned or not step_s or step < (1 - _LAST_STRETCH) * planned:
            return False
        return to_oom is None or to_oom > (planned - step) * step_s

    def verdict_due(self, step: int) -> int | None:
        """Memory rising at every sample so far, fast enough that the next sample may be the
        verdict: the step of that sample (judged then, not up to a check interval after it).
        No verdict comes below _SOON_MB of growth, so a run whose memory creeps up by a few
        kB a sample (a healthy one's Python heap) is judged at its regular checks: asked at
        every sample, the next one forced a check every 40 steps of a healthy 2,000-step run
        of the digits MLP (38 of its 47 checks)."""
        for series in (self.host, self.device):
            if len(series) >= 2 and all(b[1] > a[1] for a, b in zip(series, list(series)[1:])):
                (last, now, _), (before, then, _) = series[-1], series[-2]
                # the growth by the next sample if the last rise came twice as steep
                if now - series[0][1] + 2 * (now - then) >= _SOON_MB * _MB:
                    return int(last + (last - before))
        return None

    def _judge(self, sample: MemorySample) -> Finding | None:
        if not self.active_at(sample.step):
            return None
        for label, series, value, left in (
                ("host memory (RSS)", self.host, sample.host_bytes, sample.host_available),
                ("device memory", self.device, sample.device_bytes,
                 None if sample.device_total is None or sample.device_bytes is None
                 else sample.device_total - sample.device_bytes)):
            if value is None:
                continue
            series.append([sample.step, int(value), sample.wall])
            finding = self._growth(label, series, left)
            if finding is not None:
                return finding
        return None

    def _growth(self, label: str, series: deque[list[float]], left: int | None) -> Finding | None:
        s = self.settings
        if len(series) < 3:
            return None
        rises = sum(b[1] > a[1] for a, b in zip(series, list(series)[1:]))
        steady = rises / (len(series) - 1)
        (first_step, first, _), (last_step, last, _) = series[0], series[-1]
        grown = last - first
        if steady < s.steady_fraction or grown <= 0:
            return None
        per_s = _slope_per_s(series)
        to_oom = left / per_s if left is not None and per_s > 0 else None
        # a run's start-up is no trend to project: the first layer samples' buffers (10 MB of
        # a fast loop's first 0.3 s, steps 15-45) projected an OOM within the horizon and
        # stopped a healthy run at its start, every run of several in one process (a
        # notebook); unless that growth is already a tenth of the memory left
        settled = first_step >= _START_UP_STEPS or (left is not None and grown >= left / 10)
        soon = (to_oom is not None and to_oom <= s.horizon_s and grown >= _SOON_MB * _MB and settled
                and len(series) >= max(3, s.window // 2))
        if not soon and (len(series) < s.window or grown < s.min_growth_mb * _MB):
            return None
        if self._ends_first(last_step, to_oom):
            return None
        per_step = grown / max(1, last_step - first_step)
        return Finding(int(last_step), last / _MB, first / _MB + s.min_growth_mb, (
            f"{label} grew by {grown / _MB:.0f} MB between step {first_step:.0f} and step "
            f"{last_step:.0f} ({per_step / 1024:.0f} kB per step, rising in {steady:.0%} of "
            f"samples; now {last / _MB:.0f} MB): {_projection(to_oom, left, per_s, s.horizon_s)}; "
            f"tensors kept alive across steps? (threshold {s.min_growth_mb:g} MB)"))


def _slope_per_s(series: deque[list[float]]) -> float:
    """Least-squares growth in bytes per second over the samples."""
    times = [p[2] for p in series]
    values = [p[1] for p in series]
    mean_t, mean_v = sum(times) / len(times), sum(values) / len(values)
    spread = sum((t - mean_t) ** 2 for t in times)
    if spread <= 0:
        return 0.0
    return sum((t - mean_t) * (v - mean_v) for t, v in zip(times, values)) / spread


def _projection(to_oom: float | None, left: int | None, per_s: float, horizon_s: float) -> str:
    rate = f"{per_s / _MB:.3g} MB/s"
    if to_oom is None:
        return f"at {rate} (memory left unknown: no projection)"
    when = f"{to_oom / 60:.3g} min" if to_oom < 7200 else f"{to_oom / 3600:.3g} h"
    verdict = "within" if to_oom <= horizon_s else "beyond"
    return (f"at {rate} the {left / 2**30:.3g} GB left run out in about {when} "  # type: ignore[operator]
            f"({verdict} the {horizon_s / 60:g} min horizon)")


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
    ``<run dir>/stalled-stacks.txt`` (under torchrun ``stalled-stacks-rank{r}.txt``, saying
    whether its rank is the hung one: ``prudent.monitor.stall_stacks``), then the action
    runs. The clock is watched by a thread (``prudent.monitor.watchdog``), so this rule judges
    idle time rather than windows."""

    name = "stalled"
    needs: frozenset[str] = frozenset()  # judged by the watchdog's clock
    Settings = StalledSettings
    settings: StalledSettings

    def check(self, window: Window) -> Finding | None:
        return None  # the watchdog thread calls check_idle

    def check_idle(self, idle_s: float, step: int, started: bool,
                   stacks: str = "stacks of every thread in stalled-stacks.txt") -> Finding | None:
        """A finding once ``idle_s`` reaches the limit; ``stacks``: what it says of the stacks
        written (the monitor's words: a rank's verdict under torchrun)."""
        limit = self.settings.timeout_s if started else self.settings.startup_timeout_s
        if idle_s < limit:
            return None
        where = f"after step {step}" if started else "before the first step"
        return Finding(step, idle_s, limit, (
            f"training stalled: no step for {idle_s:.3g} s {where} (timeout {limit:g} s); "
            f"{stacks}"))
