"""Under prudent.transformers, the Trainer's ``report_to`` trackers get prudent's metrics (as
``prudent/<name>``), events and verdict in the run the Trainer's callbacks started, beside
the Trainer's own series, and no tracker run of prudent's own is made: TensorBoard (read with
EventAccumulator), W&B (offline, its .wandb file read back) and MLflow (a real server)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from prudent.kernel.events import Component
from prudent.kernel.stop import StopKind, StopReason

pytest.importorskip("accelerate")
pytest.importorskip("transformers")
from tests.adapters.test_transformers import _model, _one_thread, _trainer  # noqa: E402, F401

STEPS = 6


def train(home: Path, tmp_path: Path, name: str, report_to: str, first: bool = False) -> Any:
    """``first``: prudent's callback before every other in the Trainer's list (the
    ``report_to`` callbacks start their trackers in their on_train_begin, after prudent's)."""
    from prudent.testing import make_settings
    from prudent.transformers import PrudentCallback

    cb = PrudentCallback(name, {}, exit_on_stop=False,
                         settings=make_settings(home, checkpoint={"enabled": False}))
    trainer = _trainer(tmp_path, _model(), [cb], max_steps=STEPS, logging_steps=1,
                       report_to=report_to)
    if first:
        trainer.pop_callback(cb)
        trainer.callback_handler.callbacks.insert(0, cb)
    trainer.train()
    return cb.run


@pytest.mark.parametrize("first", [False, True], ids=["after", "first"])
def test_report_to_tensorboard_shows_prudents_rows_in_the_trainers_run_folder(
        home: Path, tmp_path: Path, first: bool) -> None:
    pytest.importorskip("tensorboard")
    from tests.tracking.test_tensorboard import read, texts

    run = train(home, tmp_path, "hf-tb", "tensorboard", first=first)
    (folder,) = {f.parent for f in (tmp_path / "out").rglob("*tfevents*")}  # one TB run
    board = read(folder)
    assert [s.step for s in board.Scalars("prudent/loss")] == list(range(1, STEPS + 1))
    assert len(board.Scalars("train/loss")) == STEPS  # the Trainer's own, untouched
    events = [text for _, text in texts(board, "prudent/events")]
    assert any(text.startswith("[lifecycle/end] completed") for text in events), events
    (summary,) = texts(board, "prudent/summary")
    assert f"run {run.context.id} completed, {STEPS} steps" in summary[1]


@pytest.mark.parametrize("first", [False, True], ids=["after", "first"])
def test_report_to_wandb_puts_prudents_rows_in_the_trainers_wandb_run(
        home: Path, tmp_path: Path, wandb_offline: Path, first: bool) -> None:
    import wandb

    from tests.tracking.wandb_files import offline_runs

    run = train(home, tmp_path, "hf-wb", "wandb", first=first)
    trainers = wandb.run
    assert trainers is not None  # prudent did not finish it
    wandb.finish()
    (found,) = offline_runs(wandb_offline)  # one W&B run: the Trainer's
    assert found.run_id == trainers.id
    steps = [row["prudent/step"] for row in found.history.values() if "prudent/loss" in row]
    assert steps == list(range(1, STEPS + 1))
    assert sum("train/loss" in row for row in found.history.values()) == STEPS
    summary = found.summary
    assert summary["prudent/verdict"].startswith(f"run {run.context.id} completed, {STEPS} steps")
    assert "[lifecycle/end] completed" in summary["prudent/events"]


@pytest.mark.slow  # the session's mlflow server takes ~20 s to start
def test_report_to_mlflow_puts_prudents_rows_in_the_trainers_mlflow_run(
        home: Path, tmp_path: Path, mlflow_server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from mlflow import MlflowClient

    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "hf")
    try:
        run = train(home, tmp_path, "hf-mlf", "mlflow")
    finally:
        os.environ.pop("MLFLOW_EXPERIMENT_ID", None)  # mlflow.set_experiment sets it
    client = MlflowClient(mlflow_server)
    (found,) = client.search_runs([client.get_experiment_by_name("hf").experiment_id])
    assert found.info.status == "FINISHED"  # ended by the Trainer's callback
    run_id = found.info.run_id
    assert [m.step for m in client.get_metric_history(run_id, "prudent/loss")] == list(
        range(1, STEPS + 1))
    assert len(client.get_metric_history(run_id, "train_loss")) >= 1  # the Trainer's own
    tags = found.data.tags
    assert tags["prudent.run_id"] == run.context.id
    assert tags["prudent.verdict"].startswith(f"run {run.context.id} completed, {STEPS} steps")
    assert tags["prudent.event.lifecycle.end"] == "completed"


class _Preempt(Component):
    """A preemption at the end of step ``at`` (as SIGTERM under ``prudent run``): prudent's
    checkpoint, with the Trainer's folder in it, and a resumable run."""

    name = "preempt"

    def __init__(self, at: int) -> None:
        self.at = at

    def on_step_end(self, run: Any, metrics: dict[str, Any]) -> None:
        if run.state.step == self.at:
            run.request_stop(StopReason(StopKind.PREEMPTED, message="a test's preemption"))


def attempt(home: Path, tmp_path: Path, report_to: str, stop_at: int | None = None) -> Any:
    """One attempt of a run (the run id from PRUDENT_RUN_ID): the second resumes the first."""
    from prudent.testing import make_settings
    from prudent.transformers import PrudentCallback

    cb = PrudentCallback("hf-again", {}, exit_on_stop=False, settings=make_settings(home))
    if stop_at is not None:
        cb.adapter.ctx.add_component(_Preempt(stop_at))
    trainer = _trainer(tmp_path, _model(), [cb], max_steps=STEPS, logging_steps=1,
                       report_to=report_to)
    trainer.train(resume_from_checkpoint=cb.resume_path())
    return cb.run


def test_a_resumed_trainer_writes_on_in_its_report_to_tensorboard_folder(
        home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("tensorboard")
    from tests.tracking.test_tensorboard import read

    monkeypatch.setenv("PRUDENT_RUN_ID", "hf-again-tb")
    first = attempt(home, tmp_path, "tensorboard", stop_at=3)
    assert (first.status, str(first.stop_reason), first.context.state.step) == (
        "stopped", "preempted", 3)
    time.sleep(1.1)  # a relaunch comes seconds later: the Trainer's default folder is a new one
    second = attempt(home, tmp_path, "tensorboard")
    assert (second.status, second.context.state.step) == ("completed", STEPS)
    (folder,) = {f.parent for f in (tmp_path / "out").rglob("*tfevents*")}  # one TB run
    board = read(folder)
    assert [s.step for s in board.Scalars("prudent/loss")] == list(range(1, STEPS + 1))
    assert [s.step for s in board.Scalars("train/loss")] == list(range(1, STEPS + 1))


def test_a_resumed_trainer_writes_on_in_its_report_to_wandb_run(
        home: Path, tmp_path: Path, wandb_offline: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    import wandb

    from tests.tracking.wandb_files import offline_runs

    monkeypatch.setenv("PRUDENT_RUN_ID", "hf-again-wb")
    attempt(home, tmp_path, "wandb", stop_at=3)
    first_id = wandb.run.id  # type: ignore[union-attr]
    wandb.finish()
    wandb.teardown()  # as a relaunch's new process: W&B reads its variables afresh
    attempt(home, tmp_path, "wandb")
    assert wandb.run is not None and wandb.run.id == first_id  # the same W&B run, resumed
    wandb.finish()
    assert "WANDB_RUN_ID" not in os.environ  # taken back once the Trainer's run was open
    found = offline_runs(wandb_offline)  # offline, each attempt is a folder of the same run
    assert {run.run_id for run in found} == {first_id} and len(found) == 2
    steps = sorted(row["prudent/step"] for run in found for row in run.history.values()
                   if "prudent/loss" in row)
    assert steps == list(range(1, STEPS + 1))


@pytest.mark.slow  # the session's mlflow server takes ~20 s to start
def test_a_resumed_trainer_writes_on_in_its_report_to_mlflow_run(
        home: Path, tmp_path: Path, mlflow_server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from mlflow import MlflowClient

    monkeypatch.setenv("PRUDENT_RUN_ID", "hf-again-mlf")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "hf-again")
    try:
        attempt(home, tmp_path, "mlflow", stop_at=3)
        attempt(home, tmp_path, "mlflow")
    finally:
        os.environ.pop("MLFLOW_EXPERIMENT_ID", None)  # mlflow.set_experiment sets it
    assert "MLFLOW_RUN_ID" not in os.environ  # taken back once the Trainer's run was open
    client = MlflowClient(mlflow_server)
    (found,) = client.search_runs([client.get_experiment_by_name("hf-again").experiment_id])
    assert found.info.status == "FINISHED"
    history = client.get_metric_history(found.info.run_id, "prudent/loss")
    assert sorted(m.step for m in history) == list(range(1, STEPS + 1))
