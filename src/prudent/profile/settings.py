"""``profile:`` in prudent.yaml, and the ``--profile-steps`` window parsed in one place."""

from __future__ import annotations

import re
from typing import Any, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, field_validator

from prudent.kernel.errors import ConfigError
from prudent.kernel.units import parse_duration_s
from prudent.profile.diagnosis import Thresholds

__all__ = ["ProfileSettings", "StepWindow", "StragglerSettings", "parse_step_window"]

_WINDOW = re.compile(r"^\s*(\d+)\s*:\s*(\d+)\s*$")


class StepWindow(NamedTuple):
    """The steps ``torch.profiler`` records: after step ``start`` completes, through ``stop``."""

    start: int
    stop: int

    def __str__(self) -> str:
        return f"{self.start}:{self.stop}"


def parse_step_window(text: str) -> StepWindow:
    """``"100:110"`` -> the 10 steps after step 100. Inverted, empty or malformed: ConfigError."""
    window, problem = _parse(text)
    if window is None:
        raise ConfigError(f"--profile-steps {text!r} is {problem}")
    return window


def _parse(text: str) -> tuple[StepWindow | None, str]:
    """The window, or None and why not (one sentence that ends with the fix)."""
    match = _WINDOW.match(str(text))
    if not match:
        return None, ("invalid: write START:STOP with whole step numbers, e.g. 100:110 to "
                      "trace the 10 steps after step 100")
    start, stop = int(match.group(1)), int(match.group(2))
    if stop <= start:
        what = "empty" if stop == start else "inverted"
        return None, (f"{what}: STOP must be greater than START, e.g. {start}:{start + 10} "
                      "to trace 10 steps")
    return StepWindow(start, stop), ""


class StragglerSettings(BaseModel):
    """``profile.straggler:`` in prudent.yaml: the rank that holds a torchrun job back
    (:class:`~prudent.profile.straggler.StragglerWatch`; nothing in a single process)."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(True, description="Under torchrun, compare the ranks' time outside "
                          "collectives and name a rank that holds the others back (off with profile.enabled).")
    interval_s: float = Field(30.0, gt=0, description="Seconds of training between two "
                              "comparisons (\"30s\", \"5min\"): each gathers every rank's "
                              "medians on rank 0, a few milliseconds.")
    relative_score: float = Field(0.7, gt=0, lt=1, description="A rank is a straggler when the "
                                  "other ranks' median time outside collectives is below this "
                                  "fraction of its own (NVIDIA Resiliency Extension's relative "
                                  "score threshold, 0.7)...")
    min_excess_pct: float = Field(10.0, ge=0, le=100, description="...and the time it takes "
                                  "beyond them is at least this % of the job's step time (half a "
                                  "millisecond of a 100 ms step slows nobody).")
    min_steps: int = Field(20, ge=1, description="Steps each rank must have timed since the last "
                           "comparison for this one to judge; comparisons are never closer than this many steps.")

    @field_validator("interval_s", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> float:
        return parse_duration_s(value)


class ProfileSettings(BaseModel):
    """``profile:`` in prudent.yaml (PRUDENT_PROFILE, PRUDENT_PROFILE_STEPS override it)."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(True, description="Time every step and sample the system; costs a "
                          "few microseconds per step.")
    interval_s: float = Field(5.0, ge=0.01, le=600, description="Seconds between samples of CPU, "
                              "memory, disk, network and GPU use (a background thread).")
    steps: str | None = Field(None, description="START:STOP: run torch.profiler for the steps "
                              "after START through STOP and write a trace and an operator table "
                              "into the run's folder (--profile-steps).")
    sync_every: int = Field(50, ge=0, description="On CUDA, synchronise the device around one "
                            "step in this many, to time device work truly; 0: never.")
    warmup_steps: int = Field(5, ge=0, description="First steps left out of the outlier search "
                              "(lazy initialisation makes them slow).")
    thresholds: Thresholds = Field(default_factory=Thresholds,
                                   description="When each finding fires.")
    straggler: StragglerSettings = Field(default_factory=StragglerSettings,
                                         description="Under torchrun: when a rank is named as "
                                         "the one the job waits for.")

    @field_validator("steps")
    @classmethod
    def _valid_window(cls, value: str | None) -> str | None:
        if value is not None and value.strip():
            window, problem = _parse(value)
            if window is None:
                raise ValueError(problem)
            return str(window)
        return None

    @property
    def window(self) -> StepWindow | None:
        return parse_step_window(self.steps) if self.steps else None
