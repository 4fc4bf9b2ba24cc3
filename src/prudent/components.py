"""The components every run gets by default, built from the project settings.

Adding a habit means adding a factory here (and its settings section in ``config.py``), not
editing the kernel or another component. Order matters only for ``on_end``: the metrics
recorder flushes first so that later components see final values.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from prudent.checkpoint import Checkpointer
from prudent.console import ConsoleReporter
from prudent.cost import CostMeter
from prudent.debug import debug_mode, failure_capture, replay_component
from prudent.debug.mode import capture_on_every_rule
from prudent.distributed import StopCoordinator, ranks_from_env
from prudent.events import Component
from prudent.monitor import Monitor
from prudent.profile import Profiler
from prudent.preemption import PreemptionWatcher
from prudent.preflight import PreflightProbe
from prudent.recorder import MetricsRecorder
from prudent.tune.trial import trial_from_env, under_tuner

if TYPE_CHECKING:
    from prudent.config import ProjectSettings

__all__ = ["DEFAULT_COMPONENTS", "default_components"]

ComponentFactory = Callable[["ProjectSettings"], "Component | None"]

DEFAULT_COMPONENTS: list[ComponentFactory] = [
    # first, so that its on_step_end closes the user's compute before other handlers run
    lambda settings: Profiler(settings.profile, quiet=settings.console.mode == "off")
    if settings.profile.enabled else None,
    # --debug: every event logged (early, so it logs an event before others act on it)
    debug_mode,
    lambda settings: MetricsRecorder(every_s=settings.store.flush_interval_s),
    lambda settings: None if settings.console.mode == "off" else ConsoleReporter(settings.console),
    lambda settings: PreemptionWatcher.build(settings.preemption),
    lambda settings: Monitor(capture_on_every_rule(under_tuner(settings.monitor),
                                                   settings.debug.enabled),
                             quiet=settings.console.mode == "off")
    if settings.monitor.enabled else None,
    # only in a trial of `prudent tune`: reports run.log's objective, prunes on the pruner's cue
    lambda settings: trial_from_env(),
    # a bundle when a step raises or turns non-finite (before the optimizer step), or a rule asks
    failure_capture,
    # on by default: $0 until an instance is known; stops before a budget or policy limit
    lambda settings: CostMeter(settings.cost, quiet=settings.console.mode == "off"),
    # last on step_end: rules have had their say (a sick step is not saved as a periodic checkpoint)
    lambda settings: Checkpointer(settings.checkpoint) if settings.checkpoint.enabled else None,
    # only under `prudent replay`: restores a bundle or runs to a step, reports it, stops
    replay_component,
    # only under `prudent preflight` (smoke mode); last, so its on_end sees the final state
    lambda settings: PreflightProbe.build(),
]


def default_components(settings: ProjectSettings) -> list[Component]:
    """The default components; under torchrun, ranks other than 0 skip the writing ones."""
    ranks = ranks_from_env()
    built = [factory(settings) for factory in DEFAULT_COMPONENTS]
    chosen = [c for c in built if c is not None and (ranks.is_main or not c.main_rank_only)]
    return [StopCoordinator(ranks), *chosen] if ranks.is_distributed else chosen
