"""Continuous profiling: where every second of a step goes, and what to change.

::

    timer.py      StepTimer: each step's wall time split into data, compute, checkpoint,
                  eval and other, from the run's events (a few microseconds a step)
    sampler.py    SystemSampler: a thread sampling CPU, memory, disk, network, GPUs (gpu.py)
    diagnosis.py  findings with stable ids, evidence and a recommendation; their Thresholds
    trace.py      TraceWindow: torch.profiler over --profile-steps START:STOP
    straggler.py  StragglerWatch: under torchrun, the rank the others wait for
    summary.py    the end-of-run summary, its console line and its table
    component.py  Profiler: the component that wires them to the run's events
    settings.py   ProfileSettings: ``profile:`` in prudent.yaml
"""

from __future__ import annotations

from prudent.kernel.lazy import lazy_exports

__all__ = [
    "Facts",
    "Finding",
    "ProfileSettings",
    "Profiler",
    "StepTimer",
    "StepWindow",
    "StragglerSettings",
    "StragglerWatch",
    "SystemSampler",
    "Thresholds",
    "diagnose",
    "parse_step_window",
]

_EXPORTS = {
    "Facts": "prudent.profile.diagnosis",
    "Finding": "prudent.profile.diagnosis",
    "ProfileSettings": "prudent.profile.settings",
    "Profiler": "prudent.profile.component",
    "StepTimer": "prudent.profile.timer",
    "StepWindow": "prudent.profile.settings",
    "StragglerSettings": "prudent.profile.settings",
    "StragglerWatch": "prudent.profile.straggler",
    "SystemSampler": "prudent.profile.sampler",
    "Thresholds": "prudent.profile.diagnosis",
    "diagnose": "prudent.profile.diagnosis",
    "parse_step_window": "prudent.profile.settings",
}
__getattr__ = lazy_exports(__name__, _EXPORTS)
