"""Debugging a failure: debug mode, failure capture, replay.

- :class:`FailureCapture` writes a bundle (batch, state before the update, RNG, stack, config,
  versions, git commit) when a step raises, a loss or gradient turns non-finite, or a rule asks;
- :class:`DebugMode` (``--debug``) logs every event, turns on anomaly detection and
  deterministic algorithms, and captures on every rule firing;
- ``prudent replay BUNDLE -- python train.py`` reruns the captured step in the unchanged script
  (:mod:`prudent.debug.replay`); ``prudent replay RUN --step S`` reruns up to step S from the
  newest checkpoint before it.

The components import torch: ``prudent.wiring.components`` builds them when a run starts.
"""

from __future__ import annotations

from prudent.debug.settings import DebugSettings
from prudent.kernel.lazy import lazy_exports

__all__ = ["BundleReplay", "DebugMode", "DebugSettings", "FailureCapture", "StepReplay"]

__getattr__ = lazy_exports(__name__, {
    "BundleReplay": "prudent.debug.replay",
    "DebugMode": "prudent.debug.mode",
    "FailureCapture": "prudent.debug.capture",
    "StepReplay": "prudent.debug.replay",
})
