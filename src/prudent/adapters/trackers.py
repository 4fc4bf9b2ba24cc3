"""The trackers a framework already logs to, as sinks prudent writes into (through
:meth:`prudent.adapters.core.AdapterRun.use_trackers`): Lightning's loggers, the HF Trainer's
``report_to`` callbacks. prudent's metrics go in as ``prudent/<name>``, apart from the series
the framework logs itself under the same names (``val_loss``); events and the end as each
tracker's sink writes them (docs/trackers.md). Each tracker's library is imported only when
the framework has that tracker.
"""

from __future__ import annotations

import functools
import logging
import os
from pathlib import Path
from typing import Any

__all__ = ["continue_lightning_loggers", "continue_trainer_reporters", "keep_trainer_reporters",
           "lightning_logger_sinks", "trackers_follow", "trainer_reporter_sinks"]

log = logging.getLogger("prudent.tracking")

_PREFIX = "prudent/"
_CARRIED = "lightning_loggers"  # carried in the checkpoint: each logger's kind and version
_REPORTERS = ("TensorBoardCallback", "MLflowCallback", "WandbCallback")
_CARRIED_REPORTERS = "trainer_reporters"  # carried in the checkpoint: each report_to's run


def continue_lightning_loggers(trainer: Any, ctx: Any) -> None:
    """A resumed fit writes on in what its first attempt's loggers wrote to, not in a new
    run of each: the same ``version_N`` folder of a TensorBoardLogger (``purge_step``) or a
    CSVLogger (its rows of the steps done again dropped), the same MLflow run of an
    MLFlowLogger, the same W&B run of a WandbLogger (``resume="allow"``). Lightning opens
    the loggers before the callbacks' ``setup``, in a new process a new run each: that one
    is closed and, when it holds nothing yet, removed. Each logger's kind and version ride in
    prudent's checkpoints (``RunContext.carried``); a logger that cannot be continued (its
    run deleted, its server down) stays as Lightning opened it, with a warning."""
    saved = ctx.resume_carried.pop(_CARRIED, None) or {
        index: {"kind": "TensorBoardLogger", "version": version}  # an older checkpoint: TB only
        for index, version in (ctx.resume_carried.pop("tensorboard_versions", None) or {}).items()}
    if not trainer.is_global_zero:
        return  # the other ranks' loggers write nothing
    versions = {}
    for index, logger in enumerate(trainer.loggers):
        kind = type(logger).__name__
        if kind not in _CONTINUE:
            continue
        before = saved.get(str(index)) or {}
        if before.get("kind") == kind and before.get("version") not in (None, logger.version) \
                and ctx.state.step > 0:
            try:
                _CONTINUE[kind](logger, before["version"], ctx.state.step)
            except Exception as exc:  # never the reason a resumed fit does not start
                log.warning("prudent: %s cannot continue %r (%s: %s); it writes to %r",
                            kind, before["version"], type(exc).__name__, exc, logger.version)
        versions[str(index)] = {"kind": kind, "version": logger.version}
    ctx.carried[_CARRIED] = versions


# Lightning's loggers take their version (folder, run id) only when built, and open it before
# any callback runs: continuing an earlier one means setting what the constructor would have
# set (their private fields, named in each function below) and opening it again.

def _continue_tensorboard(logger: Any, version: Any, step: int) -> None:
    """From ``step + 1`` on, the step that resumes (prudent's rows are at its steps, 1-based;
    Lightning's at its global step, one lower: the step that resumes is written again by
    Lightning with the value the first attempt had). TensorBoard drops what the earlier
    attempt wrote from there on."""
    opened = logger._experiment
    if opened is not None:
        opened.close()
        _remove_if_unused(Path(opened.log_dir))
    logger._version, logger._experiment = version, None
    logger._kwargs["purge_step"] = step + 1
    _ = logger.experiment


def _continue_csv(logger: Any, version: Any, step: int) -> None:
    """The writer Lightning opened is pointed at the earlier folder, whose ``metrics.csv``
    keeps the rows of the steps before the one that resumes (Lightning's own at its global
    step up to ``step - 1``, prudent's up to ``step``): the rest are done again."""
    writer = logger.experiment
    fresh = Path(writer.log_dir)
    logger._version = version
    folder = Path(logger.log_dir)
    rows, keys = _kept_csv_rows(folder / writer.NAME_METRICS_FILE, step)
    writer.log_dir, writer.metrics_file_path = str(folder), str(folder / writer.NAME_METRICS_FILE)
    writer.metrics_keys[:] = keys
    _write_csv(folder / writer.NAME_METRICS_FILE, keys, rows)
    if fresh != folder:
        _remove_if_unused(fresh)


def _kept_csv_rows(path: Path, step: int) -> tuple[list[dict[str, str]], list[str]]:
    import csv

    if not path.is_file():
        return [], []
    with path.open(newline="") as file:
        reader = csv.DictReader(file)
        rows, keys = list(reader), list(reader.fieldnames or [])
    return [r for r in rows if _csv_step(r) < step + (1 if _ours(r) else 0)], keys


def _csv_step(row: dict[str, str]) -> float:
    try:
        return float(row.get("step") or "inf")
    except ValueError:
        return float("inf")


def _ours(row: dict[str, str]) -> bool:
    """A row prudent wrote (only ``prudent/`` columns filled): at prudent's 1-based step."""
    return all(not value for key, value in row.items()
               if key != "step" and not key.startswith(_PREFIX))


def _write_csv(path: Path, keys: list[str], rows: list[dict[str, str]]) -> None:
    import csv

    if not keys:
        path.unlink(missing_ok=True)
        return
    with path.open("w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)


def _continue_mlflow(logger: Any, run_id: str, step: int) -> None:
    """The earlier MLflow run back to RUNNING (Lightning finalized it when the first attempt
    ended); the run Lightning just created, still empty, deleted: one run in the experiment."""
    client = logger.experiment
    earlier = client.get_run(run_id)
    if earlier.info.lifecycle_stage != "active":
        raise ValueError(f"MLflow run {run_id} is {earlier.info.lifecycle_stage}")
    fresh = logger.run_id
    logger._run_id, logger._experiment_id = run_id, earlier.info.experiment_id
    client.update_run(run_id, status="RUNNING")
    data = client.get_run(fresh).data
    if not (data.metrics or data.params):
        client.delete_run(fresh)


def _continue_wandb(logger: Any, run_id: str, step: int) -> None:
    """The W&B run Lightning just started, still empty, finished (offline, its folder
    removed); Lightning's own ``wandb.init`` again with the earlier run's id and
    ``resume="allow"``."""
    fresh = logger.experiment
    folder = Path(fresh.dir).parent if fresh.offline else None
    fresh.finish()
    if folder is not None:
        import shutil

        shutil.rmtree(folder, ignore_errors=True)
    logger._wandb_init.update(id=run_id, resume="allow")
    logger._id, logger._experiment = run_id, None
    _ = logger.experiment


_CONTINUE = {"TensorBoardLogger": _continue_tensorboard, "CSVLogger": _continue_csv,
             "MLFlowLogger": _continue_mlflow, "WandbLogger": _continue_wandb}


def _remove_if_unused(folder: Path) -> None:
    """A version folder Lightning just made that holds nothing but a writer's empty file."""
    files = list(folder.iterdir()) if folder.is_dir() else []
    if all(f.is_file() and f.stat().st_size < 1024 and (
            f.name.startswith("events.out.tfevents") or f.name == "metrics.csv") for f in files):
        for f in files:
            f.unlink()
        folder.rmdir()


def lightning_logger_sinks(trainer: Any, info: Any) -> list[Any]:
    """A sink for each of the Trainer's loggers prudent can write into, around the logger's
    own experiment (its SummaryWriter, MLflow run, W&B run, CSV writer: that one's rows are
    handed to the training thread, see :class:`~prudent.tracking.csvlogger.CsvLoggerSink`);
    Lightning finalizes its loggers after ``on_fit_end``, where prudent's end is written, and
    prudent ends none of them."""
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
        elif kind == "CSVLogger":
            from prudent.tracking.csvlogger import CsvLoggerSink

            sinks.append(CsvLoggerSink(logger, info, metric_prefix=_PREFIX))
    return sinks


def trainer_reporter_sinks(trainer: Any, info: Any) -> list[Any]:
    """A sink for each ``report_to`` tracker the Trainer's callbacks started: the active W&B
    and MLflow runs (prudent ends neither), and a writer of prudent's own beside the
    TensorBoard callback's (which closes its writer in its ``on_train_end``, before ours)."""
    if trainer is None:
        return []
    sinks: list[Any] = []
    for kind, callback in _reporters(trainer):
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


def continue_trainer_reporters(trainer: Any, ctx: Any) -> list[str]:
    """A resumed ``Trainer.train`` writes on in its first attempt's ``report_to`` runs, not
    in a new one each: the same TensorBoard folder (``purge_step`` at the step that
    resumes), the same MLflow run (``MLFLOW_RUN_ID``), the same W&B run (``WANDB_RUN_ID``,
    ``WANDB_RESUME=allow``). Called before the callbacks start their trackers (the
    Trainer's ``on_init_end``); a variable the user set is left alone. Returns the
    variables set, for :func:`keep_trainer_reporters` to take back once the trackers run."""
    saved = ctx.resume_carried.pop(_CARRIED_REPORTERS, None) or {}
    if trainer is None or not saved or ctx.state.step <= 0:
        return []
    set_here: list[str] = []
    for kind, callback in _reporters(trainer):
        try:
            # (the folder is on this machine's disk: a new machine starts a folder of its own)
            if (kind == "TensorBoardCallback" and saved.get("tensorboard")
                    and callback.tb_writer is None and callback.logging_dir is None
                    and Path(saved["tensorboard"]).is_dir()):
                callback.logging_dir = saved["tensorboard"]
                callback._SummaryWriter = functools.partial(callback._SummaryWriter,
                                                            purge_step=ctx.state.step + 1)
            elif kind == "MLflowCallback" and saved.get("mlflow") and \
                    "MLFLOW_RUN_ID" not in os.environ:
                os.environ["MLFLOW_RUN_ID"] = saved["mlflow"]
                set_here.append("MLFLOW_RUN_ID")
            elif kind == "WandbCallback" and saved.get("wandb") and \
                    "WANDB_RUN_ID" not in os.environ:
                os.environ["WANDB_RUN_ID"] = saved["wandb"]
                set_here.append("WANDB_RUN_ID")
                if "WANDB_RESUME" not in os.environ:
                    os.environ["WANDB_RESUME"] = "allow"
                    set_here.append("WANDB_RESUME")
        except Exception as exc:  # never the reason a resumed run does not start
            log.warning("prudent: %s cannot continue its earlier run (%s: %s); it starts a "
                        "new one", kind, type(exc).__name__, exc)
    return set_here


def keep_trainer_reporters(trainer: Any, ctx: Any, set_here: list[str]) -> None:
    """Once the ``report_to`` callbacks have started their trackers: which run each writes
    to, carried in prudent's checkpoints for the next attempt; the variables
    :func:`continue_trainer_reporters` set are taken back (a later Trainer of the same
    script starts a run of its own, as without prudent)."""
    for name in set_here:
        os.environ.pop(name, None)
    if trainer is None:
        return
    runs: dict[str, str] = {}
    for kind, callback in _reporters(trainer):
        if kind == "TensorBoardCallback" and callback.logging_dir:
            runs["tensorboard"] = str(callback.logging_dir)
        elif kind == "MLflowCallback":
            from prudent.tracking.mlflow import active_mlflow_run

            active = active_mlflow_run()
            if active is not None:
                runs["mlflow"] = active[0]
        elif kind == "WandbCallback":
            from prudent.tracking.wandb import active_wandb_run

            run = active_wandb_run()
            if run is not None:
                runs["wandb"] = run.id
    if runs:
        ctx.carried[_CARRIED_REPORTERS] = runs


def _reporters(trainer: Any) -> list[tuple[str, Any]]:
    """The Trainer's ``report_to`` callbacks, each with its class name, in the Trainer's order."""
    return [(type(c).__name__, c) for c in trainer.callback_handler.callbacks
            if type(c).__name__ in _REPORTERS]


def trackers_follow(trainer: Any, callback: Any) -> bool:
    """Some ``report_to`` callback comes after ``callback`` in the Trainer's list: it starts
    its tracker in its own ``on_train_begin``, after ``callback``'s, so its sink can only be
    built later (the first step's start)."""
    if trainer is None:
        return False
    callbacks = list(trainer.callback_handler.callbacks)
    after = callbacks[callbacks.index(callback) + 1:] if callback in callbacks else []
    return any(type(c).__name__ in _REPORTERS for c in after)
