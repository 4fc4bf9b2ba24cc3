"""The trackers a framework already logs to, as sinks prudent writes into (through
:meth:`prudent.adapters.core.AdapterRun.use_trackers`): Lightning's loggers, the HF Trainer's
``report_to`` callbacks. prudent's metrics go in as ``prudent/<name>``, apart from the series
the framework logs itself under the same names (``val_loss``); events and the end as each
tracker's sink writes them (docs/trackers.md). Each tracker's library is imported only when
the framework has that tracker.
"""

from __future__ import annotations

from typing import Any

__all__ = ["lightning_logger_sinks", "trainer_reporter_sinks"]

_PREFIX = "prudent/"


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
