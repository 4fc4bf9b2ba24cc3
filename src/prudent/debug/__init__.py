"""Debugging a failure: debug mode, failure capture, replay.

- :class:`FailureCapture` writes a bundle (batch, state before the update, RNG, stack, config,
  versions, git commit) when a step raises, a loss or gradient turns non-finite, or a rule asks;
- :class:`DebugMode` (``--debug``) logs every event, turns on anomaly detection and
  deterministic algorithms, and captures on every rule firing;
- ``prudent replay BUNDLE -- python train.py`` reruns the captured step in the unchanged script
  (:mod:`prudent.debug.replay`); ``prudent replay RUN --step S`` reruns up to step S from the
  newest checkpoint before it.

The components import torch: the factories below import them when a run is built.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from prudent.debug.settings import DebugSettings

if TYPE_CHECKING:
    from prudent.config import ProjectSettings
    from prudent.events import Component

__all__ = ["DebugSettings", "debug_mode", "failure_capture", "replay_component"]


def debug_mode(settings: ProjectSettings) -> Component | None:
    """The DebugMode component, when debug mode is on."""
    from prudent.debug.mode import DebugMode

    return DebugMode() if settings.debug.enabled else None


def failure_capture(settings: ProjectSettings) -> Component | None:
    """The FailureCapture component (on by default; never while replaying a bundle, which
    would write a bundle of the bundle)."""
    from prudent.debug.capture import FailureCapture
    from prudent.debug.replay import ENV_REPLAY

    if not settings.debug.capture or os.environ.get(ENV_REPLAY):
        return None
    return FailureCapture(settings.debug, quiet=settings.console.mode == "off")


def replay_component(settings: ProjectSettings) -> Component | None:
    """The replay component, only in a process launched by ``prudent replay``."""
    from prudent.debug.replay import replay_from_env

    return replay_from_env()
