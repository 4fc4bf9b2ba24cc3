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
from prudent.distributed import StopCoordinator, ranks_from_env
from prudent.events import Component
from prudent.monitor import Monitor
from prudent.profile import Profiler
from prudent.preemption import PreemptionWatcher
from prudent.recorder import MetricsRecorder

if TYPE_CHECKING:
    from prudent.config import ProjectSettings

__all__ = ["DEFAULT_COMPONENTS", "default_components"]

ComponentFactory = Callable[["ProjectSettings"], "Component | None"]

DEFAULT_COMPONENTS: list[ComponentFactory] = [
    # first, so that its on_step_end closes the user's compute before other handlers run
    lambda settings: Profiler(settings.profile, quiet=settings.console.mode == "off")
    if settings.profile.enabled else None,
    lambda settings: MetricsRecorder(every_s=settings.store.flush_interval_s),
    lambda settings: None if settings.console.mode == "off" else ConsoleReporter(settings.console),
    lambda settings: PreemptionWatcher.build(settings.preemption),
    lambda settings: Monitor(settings.monitor, quiet=settings.console.mode == "off")
    if settings.monitor.enabled else None,
    # on by default: $0 until an instance is known; stops before a budget or policy limit
    lambda settings: CostMeter(settings.cost, quiet=settings.console.mode == "off"),
    # last on step_end: rules have had their say (a sick step is not saved as a periodic checkpoint)
    lambda settings: Checkpointer(settings.checkpoint) if settings.checkpoint.enabled else None,
]


def default_components(settings: ProjectSettings) -> list[Component]:
    """The default components; under torchrun, ranks other than 0 skip the writing ones."""
    ranks = ranks_from_env()
    built = [factory(settings) for factory in DEFAULT_COMPONENTS]
    chosen = [c for c in built if c is not None and (ranks.is_main or not c.main_rank_only)]
    return [StopCoordinator(ranks), *chosen] if ranks.is_distributed else chosen
