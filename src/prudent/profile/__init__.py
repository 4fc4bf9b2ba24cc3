"""Continuous profiling: where every second of a step goes, and what to change.

::

    timer.py      StepTimer: each step's wall time split into data, compute, checkpoint,
                  eval and other, from the run's events (a few microseconds a step)
    sampler.py    SystemSampler: a thread sampling CPU, memory, disk, network, GPUs (gpu.py)
    diagnosis.py  findings with stable ids, evidence and a recommendation; their Thresholds
    trace.py      TraceWindow: torch.profiler over --profile-steps START:STOP
    summary.py    the end-of-run summary, its console line and its table
    component.py  Profiler: the component that wires them to the run's events
    settings.py   ProfileSettings: ``profile:`` in prudent.yaml
"""

from __future__ import annotations

__all__ = [
    "Facts",
    "Finding",
    "ProfileSettings",
    "Profiler",
    "StepTimer",
    "StepWindow",
    "SystemSampler",
    "Thresholds",
    "diagnose",
    "parse_step_window",
]

from prudent.profile.component import Profiler
from prudent.profile.diagnosis import Facts, Finding, Thresholds, diagnose
from prudent.profile.sampler import SystemSampler
from prudent.profile.settings import ProfileSettings, StepWindow, parse_step_window
from prudent.profile.timer import StepTimer
