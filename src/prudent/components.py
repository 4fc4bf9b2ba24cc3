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
from prudent.events import Component
from prudent.preemption import PreemptionWatcher
from prudent.recorder import MetricsRecorder

if TYPE_CHECKING:
    from prudent.config import ProjectSettings

__all__ = ["DEFAULT_COMPONENTS", "default_components"]

ComponentFactory = Callable[["ProjectSettings"], "Component | None"]

DEFAULT_COMPONENTS: list[ComponentFactory] = [
    lambda settings: MetricsRecorder(every_s=settings.store.flush_interval_s),
    lambda settings: None if settings.console.mode == "off" else ConsoleReporter(settings.console),
    lambda settings: PreemptionWatcher.build(settings.preemption),
    # last on step_end: rules have had their say (a sick step is not saved as a periodic checkpoint)
    lambda settings: Checkpointer(settings.checkpoint) if settings.checkpoint.enabled else None,
]


def default_components(settings: ProjectSettings) -> list[Component]:
    built = (factory(settings) for factory in DEFAULT_COMPONENTS)
    return [component for component in built if component is not None]
