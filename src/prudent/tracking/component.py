"""TrackingComponent: plugs the configured trackers (TensorBoard, MLflow, W&B) into a run, on
rank 0 only (``main_rank_only``: under torchrun the other ranks get no tracker).

It builds the sinks at the run's start (a tracker configured but not installed refuses the
run, naming the extra), hands them the run's config, listens to the store writer for
metrics and events, and at the end adds a summary: status, stop reason, verdict, cost, the
profile's summary and the HTML report's path when there is one.

Trackers someone else started are written into, not doubled by a run of prudent's own: the
script's active MLflow run and ``wandb.run`` at the start, a ``SummaryWriter`` given to
``run.attach``, a framework's loggers found by an adapter (:meth:`TrackingComponent.adopt`).
A tracker configured in prudent.yaml wins over one of its kind found this way; each target
(one W&B run, one MLflow run, one TensorBoard folder) gets one sink.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from prudent.kernel.events import Component
from prudent.tracking.base import RunInfo, TrackerSink
from prudent.tracking.dispatch import TrackingDispatcher
from prudent.tracking.settings import TrackingSettings

if TYPE_CHECKING:
    from prudent.kernel.context import RunContext
    from prudent.kernel.stop import StopReason

__all__ = ["TrackingComponent", "build_sinks", "picked_up_sinks"]

log = logging.getLogger("prudent.tracking")


class TrackingComponent(Component):
    name = "tracking"
    main_rank_only = True

    def __init__(self, settings: TrackingSettings, sinks: list[TrackerSink] | None = None) -> None:
        """``sinks``: instead of those ``settings`` configure (a tracker of your own)."""
        self.settings = settings
        self.sinks = sinks
        self.dispatcher: TrackingDispatcher | None = None
        self._info: RunInfo | None = None
        self._targets: set[str] = set()  # trackers someone else started, already written to

    @classmethod
    def build(cls, settings: TrackingSettings) -> TrackingComponent:
        """Always plugged in: with no tracker configured it only looks for one the script
        started (an active MLflow or W&B run at the start, a ``SummaryWriter`` given to
        ``run.attach``, a framework's loggers), and a run with none pays for no thread."""
        return cls(settings)

    def on_start(self, ctx: RunContext) -> None:
        info = self._info = RunInfo(run_id=ctx.id, name=ctx.name, run_dir=ctx.run_dir)
        sinks = self.sinks if self.sinks is not None else build_sinks(self.settings, info)
        if self.sinks is None:
            found = [s for s in picked_up_sinks(info) if self._new(s)]
            self._targets.update(s.target for s in found)
            sinks += found
        if sinks:
            self._start(ctx, sinks)

    def _new(self, sink: TrackerSink, even_if_configured: bool = False) -> bool:
        """Not of a kind prudent.yaml configures, nor a target already written to."""
        configured = getattr(self.settings, sink.name, None)
        taken = configured is not None and configured.enabled and not even_if_configured
        return not taken and sink.target not in self._targets

    def _start(self, ctx: RunContext, sinks: list[TrackerSink]) -> None:
        settings = self.settings
        self.dispatcher = TrackingDispatcher(sinks, settings.flush_interval_s,
                                             settings.max_buffered_rows, settings.close_timeout_s)
        ctx.writer.add_listener(self.dispatcher)
        self.dispatcher.put("config", _config_of(ctx))

    def take_writer(self, ctx: RunContext, writer: Any) -> None:
        """A ``SummaryWriter`` the script passed to ``run.attach``: prudent's rows go into it
        too (from now on; the run's config first)."""
        from prudent.tracking.tensorboard import TensorBoardSink

        self.adopt(ctx, lambda info: [TensorBoardSink.around(writer, info)],
                   even_if_configured=True)  # handed over by name: wanted beside prudent's

    def adopt(self, ctx: RunContext, find: Callable[[RunInfo], list[TrackerSink]],
              even_if_configured: bool = False) -> None:
        """Trackers someone else started, found during the run (``find(info)`` builds their
        sinks): each new one gets the run's config, then every row from now on. One that
        cannot be reached is left out with a warning; training goes on."""
        if self._info is None:
            return
        try:
            found = [sink for sink in find(self._info) if self._new(sink, even_if_configured)]
        except Exception as exc:  # the framework's logger failed to start: not prudent's run
            log.warning("prudent: cannot write to the framework's tracker (%s: %s); training "
                        "goes on", type(exc).__name__, exc)
            return
        self._targets.update(sink.target for sink in found)
        for sink in found:
            if self.dispatcher is None:
                self._start(ctx, [sink])
            else:
                self.dispatcher.add_sink(sink, [("config", _config_of(ctx))])

    def on_end(self, ctx: RunContext, status: str, reason: StopReason | None) -> None:
        if self.dispatcher is None:
            return
        self.dispatcher.status = status
        self.dispatcher.put("summary", run_summary(ctx, status, reason))


def _config_of(ctx: RunContext) -> dict[str, Any]:
    config = ctx.config
    untracked = getattr(config, "untracked", None)  # reading it is not the script's read
    return untracked() if untracked is not None else dict(config)


def picked_up_sinks(info: RunInfo) -> list[TrackerSink]:
    """Trackers the script already started: an active MLflow run, an active ``wandb.run``
    (neither library is imported here unless the script did)."""
    from prudent.tracking.mlflow import active_mlflow_run
    from prudent.tracking.wandb import active_wandb_run

    sinks: list[TrackerSink] = []
    active = active_mlflow_run()
    if active is not None:
        from prudent.tracking.mlflow import MlflowSink
        from prudent.tracking.settings import MlflowSettings

        run_id, tracking_uri = active
        sinks.append(MlflowSink(MlflowSettings(tracking_uri=tracking_uri), info,
                                active_run_id=run_id))
    run = active_wandb_run()
    if run is not None:
        from prudent.tracking.wandb import WandbSink

        sinks.append(WandbSink.around(run, info))
    return sinks


def build_sinks(settings: TrackingSettings, info: RunInfo) -> list[TrackerSink]:
    """The configured trackers' sinks (each imports its library here, not before)."""
    sinks: list[TrackerSink] = []
    if settings.tensorboard is not None and settings.tensorboard.enabled:
        from prudent.tracking.tensorboard import TensorBoardSink

        sinks.append(TensorBoardSink(settings.tensorboard, info))
    if settings.mlflow is not None and settings.mlflow.enabled:
        from prudent.tracking.mlflow import MlflowSink

        sinks.append(MlflowSink(settings.mlflow, info))
    if settings.wandb is not None and settings.wandb.enabled:
        from prudent.tracking.wandb import WandbSink

        sinks.append(WandbSink(settings.wandb, info))
    return sinks


def run_summary(ctx: RunContext, status: str, reason: StopReason | None) -> dict[str, Any]:
    """The attempt's end as the trackers show it (the latest metrics arrive as metrics)."""
    gauges = ctx.gauges
    cost = gauges.get("cost_final_usd", gauges.get("cost_usd"))
    how = f"{status} ({reason})" if reason is not None else status
    verdict = f"run {ctx.id} {how}, {ctx.state.step} steps" + (
        f"; cost ${cost:.2f}" if cost is not None else "")
    report = ctx.run_dir / "report.html"
    return {"status": status, "stop_reason": str(reason) if reason is not None else None,
            "stop_message": reason.message if reason is not None else None,
            "exit_code": ctx.exit_code,
            "verdict": verdict, "step": ctx.state.step, "epoch": ctx.state.epoch,
            "cost_usd": cost, "report_path": str(report) if report.is_file() else None}

