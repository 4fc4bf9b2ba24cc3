"""The components every run gets by default, built from the project settings and the launch.

This is the one module that knows every plug-in: :func:`prudent.init` calls
:func:`default_components`, and the kernel never imports this. Adding a habit means adding a
factory here (and its settings section in ``config.py``), not editing the kernel or another
component. Order matters only for ``on_end``: the metrics recorder flushes first so that later
components see final values.
"""

from __future__ import annotations

from collections.abc import Callable

from prudent.checkpoint.manager import Checkpointer
from prudent.console.reporter import ConsoleReporter
from prudent.cost.meter import CostMeter
from prudent.debug.capture import FailureCapture
from prudent.debug.mode import DebugMode, capture_on_every_rule
from prudent.debug.replay import replay_from_env
from prudent.distributed.torchrun import StopCoordinator, ranks_from_env
from prudent.kernel.events import Component
from prudent.launch.spec import LaunchSpec
from prudent.monitor.monitor import Monitor
from prudent.preemption.watcher import PreemptionWatcher
from prudent.preflight.probe import PreflightProbe
from prudent.profile.component import Profiler
from prudent.profile.straggler import StragglerWatch
from prudent.record.sync import RecordSync
from prudent.store.recorder import MetricsRecorder
from prudent.tracking.component import TrackingComponent
from prudent.tune.trial import trial_from_env, under_tuner
from prudent.watches.own_checkpoint import ScriptResumeWatch
from prudent.watches.unread_config import UnreadConfigWatch
from prudent.wiring.config import ProjectSettings

__all__ = ["DEFAULT_COMPONENTS", "default_components"]

ComponentFactory = Callable[[ProjectSettings, LaunchSpec], "Component | None"]


def _profiler(settings: ProjectSettings, spec: LaunchSpec) -> Component | None:
    """On every rank (each times its own loop); under torchrun only rank 0 prints its
    summary: one line per job, not one per rank."""
    if not settings.profile.enabled:
        return None
    return Profiler(settings.profile, quiet=_quiet(settings) or not ranks_from_env().is_main)


def _straggler_watch(settings: ProjectSettings, spec: LaunchSpec) -> Component | None:
    """Under torchrun only, on every rank: each times itself, rank 0 compares them."""
    profile = settings.profile
    if not (profile.enabled and profile.straggler.enabled and ranks_from_env().is_distributed):
        return None
    return StragglerWatch(profile.straggler, quiet=_quiet(settings))


def _debug_mode(settings: ProjectSettings, spec: LaunchSpec) -> Component | None:
    return DebugMode() if settings.debug.enabled else None


def _monitor(settings: ProjectSettings, spec: LaunchSpec) -> Component | None:
    if not settings.monitor.enabled:
        return None
    rules = capture_on_every_rule(under_tuner(settings.monitor), settings.debug.enabled)
    return Monitor(rules, quiet=_quiet(settings))


def _failure_capture(settings: ProjectSettings, spec: LaunchSpec) -> Component | None:
    """On by default; never while replaying a bundle (it would write a bundle of the bundle)."""
    if not settings.debug.capture or spec.replay is not None:
        return None
    return FailureCapture(settings.debug, quiet=_quiet(settings))


def _quiet(settings: ProjectSettings) -> bool:
    return settings.console.mode == "off"


DEFAULT_COMPONENTS: list[ComponentFactory] = [
    # first, so that its on_step_end closes the user's compute before other handlers run
    _profiler,
    # under torchrun: names the rank the others wait for (compares on agreed steps)
    _straggler_watch,
    # --debug: every event logged (early, so it logs an event before others act on it)
    _debug_mode,
    lambda settings, spec: MetricsRecorder(every_s=settings.store.flush_interval_s),
    lambda settings, spec: None if _quiet(settings) else ConsoleReporter(settings.console),
    lambda settings, spec: PreemptionWatcher.build(settings.preemption),
    _monitor,
    # only in a trial of `prudent tune`: reports run.log's objective, prunes on the pruner's cue
    lambda settings, spec: trial_from_env(),
    # a --set (or trial) key the script has not read by its first epoch's end: a warning, and
    # a failed trial under the tuner
    lambda settings, spec: UnreadConfigWatch.build(spec, quiet=_quiet(settings)),
    # a script that resumes from a checkpoint of its own (nanoGPT's init_from='resume')
    lambda settings, spec: ScriptResumeWatch(quiet=_quiet(settings)),
    # a bundle when a step raises or turns non-finite (before the optimizer step), or a rule asks
    _failure_capture,
    # the record that travelled with the checkpoints is merged before the meter reads the spend
    lambda settings, spec: RecordSync(settings.checkpoint) if settings.checkpoint.enabled
    else None,
    # on by default: $0 until an instance is known; stops before a budget or policy limit
    lambda settings, spec: CostMeter(settings.cost, quiet=_quiet(settings)),
    # TensorBoard, MLflow (rank 0), fed from the store writer's thread; its end-of-run
    # summary comes after the recorder's last metrics, the profile's summary and the meter's cost
    lambda settings, spec: TrackingComponent.build(settings.tracking),
    # last on step_end: rules have had their say (a sick step is not saved as a periodic checkpoint)
    lambda settings, spec: Checkpointer(settings.checkpoint, quiet=_quiet(settings))
    if settings.checkpoint.enabled
    else None,
    # only under `prudent replay`: restores a bundle or runs to a step, reports it, stops
    lambda settings, spec: replay_from_env(),
    # only under `prudent preflight` (smoke mode); last, so its on_end sees the final state
    lambda settings, spec: PreflightProbe.build(),
]


def default_components(settings: ProjectSettings, spec: LaunchSpec | None = None
                       ) -> list[Component]:
    """The default components; under torchrun, ranks other than 0 skip the writing ones."""
    spec = spec if spec is not None else LaunchSpec.from_env()
    ranks = ranks_from_env()
    built = [factory(settings, spec) for factory in DEFAULT_COMPONENTS]
    chosen = [c for c in built if c is not None and (ranks.is_main or not c.main_rank_only)]
    if not ranks.is_distributed:
        return chosen
    # first on step_end: reads what the ranks agreed
    coordinator = StopCoordinator(ranks, settings.run.ranks_agree_every_s)
    return [coordinator, *chosen, coordinator.poster]  # last: posts this step's flags
