"""The trackers a framework already logs to, as sinks prudent writes into (through
:meth:`prudent.adapters.core.AdapterRun.use_trackers`): Lightning's loggers, the HF Trainer's
``report_to`` callbacks. prudent's metrics go in as ``prudent/<name>``, apart from the series
the framework logs itself under the same names (``val_loss``); events and the end as each
tracker's sink writes them (docs/trackers.md). Each tracker's library is imported only when
the framework has that tracker.
"""

from __future__ import annotations

from typing import Any

__all__ = ["continue_lightning_tensorboard", "lightning_logger_sinks", "trainer_reporter_sinks"]

_PREFIX = "prudent/"
_VERSIONS = "tensorboard_versions"  # carried in the checkpoint: each TensorBoardLogger's folder


def continue_lightning_tensorboard(trainer: Any, ctx: Any) -> None:
    """A resumed fit writes on in its first attempt's ``version_N`` folder of each
    TensorBoardLogger, from the first step it trains again (``purge_step``: TensorBoard drops
    what the earlier attempt wrote from there on), not in a ``version_N+1`` of its own: one
    curve per series. Lightning opens the loggers' writers before the callbacks' ``setup``:
    the one it just opened in a new folder is closed, and that folder removed if it holds
    nothing but that writer's empty file. Each logger's version is carried in prudent's
    checkpoints (``RunContext.carried``)."""
    saved = ctx.resume_carried.pop(_VERSIONS, None) or {}
    versions = {}
    for index, logger in enumerate(trainer.loggers):
        if type(logger).__name__ != "TensorBoardLogger":
            continue
        before = saved.get(str(index))
        if before is not None and before != logger.version and ctx.state.step > 0:
            _reopen(logger, before, purge_step=ctx.state.step + 1)
        versions[str(index)] = logger.version
    ctx.carried[_VERSIONS] = versions


def _reopen(logger: Any, version: Any, purge_step: int) -> None:
    """Point a TensorBoardLogger at ``version``'s folder, its writer from ``purge_step`` on.
    (prudent's rows are at its steps, 1-based; Lightning's at its global step, one lower: the
    step that resumes is written again by Lightning with the value the first attempt had.)"""
    from pathlib import Path

    opened = logger._experiment
    if opened is not None:
        fresh = Path(opened.log_dir)
        opened.close()
        files = list(fresh.iterdir()) if fresh.is_dir() else []
        if all(f.name.startswith("events.out.tfevents") and f.stat().st_size < 1024
               for f in files):
            for f in files:
                f.unlink()
            fresh.rmdir()
    logger._version, logger._experiment = version, None
    logger._kwargs["purge_step"] = purge_step
    _ = logger.experiment


def lightning_logger_sinks(trainer: Any, info: Any) -> list[Any]:
    """A sink for each of the Trainer's loggers prudent can write into, around the logger's
    own experiment (its SummaryWriter, MLflow run, W&B run); Lightning finalizes its loggers
    after ``on_fit_end``, where prudent's end is written, and prudent ends none of them."""
    from prudent.tracking.tensorboard import TensorBoardSink, is_summary_writer

    sinks: list[Any] = []
    for logger in trainer.loggers:
        kind = type(logger).__name__
        if kind == "MLFlowLogger":
            from prudent.tracking.mlflow import MlflowSink
            from prudent.tracking.settings import MlflowSettings

            uri = logger.experiment.tracking_uri
            sinks.append(MlflowSink(MlflowSettings(tracking_uri=uri), info,
                                    active_run_id=logger.run_id, metric_prefix=_PREFIX))
        elif kind == "WandbLogger":
            from prudent.tracking.wandb import WandbSink

            sinks.append(WandbSink.around(logger.experiment, info, metric_prefix=_PREFIX))
        elif kind == "TensorBoardLogger" and is_summary_writer(logger.experiment):
            sinks.append(TensorBoardSink.around(logger.experiment, info, metric_prefix=_PREFIX))
    return sinks


def trainer_reporter_sinks(trainer: Any, info: Any) -> list[Any]:
    """A sink for each ``report_to`` tracker the Trainer's callbacks started: the active W&B
    and MLflow runs (prudent ends neither), and a writer of prudent's own beside the
    TensorBoard callback's (which closes its writer in its ``on_train_end``, before ours)."""
    if trainer is None:
        return []
    sinks: list[Any] = []
    for callback in trainer.callback_handler.callbacks:
        kind = type(callback).__name__
        if kind == "TensorBoardCallback" and callback.tb_writer is not None:
            from prudent.tracking.tensorboard import TensorBoardSink

            writer = callback.tb_writer
            logdir = getattr(writer, "log_dir", None) or writer.logdir  # torch's, tensorboardX's
            sinks.append(TensorBoardSink.beside(logdir, info, metric_prefix=_PREFIX))
        elif kind == "MLflowCallback":
            from prudent.tracking.mlflow import MlflowSink, active_mlflow_run
            from prudent.tracking.settings import MlflowSettings

            active = active_mlflow_run()
            if active is not None:
                sinks.append(MlflowSink(MlflowSettings(tracking_uri=active[1]), info,
                                        active_run_id=active[0], metric_prefix=_PREFIX))
        elif kind == "WandbCallback":
            from prudent.tracking.wandb import WandbSink, active_wandb_run

            run = active_wandb_run()
            if run is not None:
                sinks.append(WandbSink.around(run, info, metric_prefix=_PREFIX))
    return sinks
