"""Under prudent.lightning, the Trainer's own logger gets prudent's metrics (as
``prudent/<name>``), events and verdict in the logger's run, beside Lightning's own series,
and no tracker run of prudent's own is made: TensorBoardLogger (its event files read with
EventAccumulator), WandbLogger (offline, its run's .wandb file read back), MLFlowLogger
(a real MLflow server read with MlflowClient) and CSVLogger (its metrics.csv). Resumed fits:
tests/e2e/test_adapter_lightning.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from prudent.testing import make_settings, tiny_loader, tiny_model

L = pytest.importorskip("lightning")
# Lightning's own _pytree calls a torch API that torch deprecates (not ours to change)
pytestmark = pytest.mark.filterwarnings("ignore:`isinstance.treespec, LeafSpec.`:FutureWarning")

STEPS = 8


class _Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = tiny_model()

    def training_step(self, batch: Any, idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.log("train_loss", loss)  # Lightning's own series, in the same logger
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def fit(home: Path, name: str, logger: Any, **settings: Any) -> Any:
    from prudent.lightning import PrudentCallback

    cb = PrudentCallback(name, {"lr": 0.1}, exit_on_stop=False, settings=make_settings(
        home, checkpoint={"enabled": False}, **settings))
    trainer = L.Trainer(max_steps=STEPS, callbacks=[cb], accelerator="cpu", logger=logger,
                        log_every_n_steps=1, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(_Tiny(), tiny_loader(num_samples=64, batch_size=8))
    return cb.run


def test_a_tensorboard_logger_gets_prudents_metrics_events_and_verdict(
        home: Path, tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tests.tracking.test_tensorboard import read, texts

    logger = L.pytorch.loggers.TensorBoardLogger(str(tmp_path / "tb"), name="lit")
    run = fit(home, "lit-tb", logger)
    files = list((tmp_path / "tb").rglob("*tfevents*"))
    assert {f.parent for f in files} == {Path(logger.log_dir)}  # one TensorBoard run
    board = read(Path(logger.log_dir))
    assert [s.step for s in board.Scalars("prudent/loss")] == list(range(1, STEPS + 1))
    assert len(board.Scalars("train_loss")) == STEPS  # Lightning's own, untouched
    events = [text for _, text in texts(board, "prudent/events")]
    assert any(text.startswith("[lifecycle/end] completed") for text in events), events
    (summary,) = texts(board, "prudent/summary")
    assert f"run {run.context.id} completed, {STEPS} steps" in summary[1]
    assert "| lr | 0.1 |" in texts(board, "prudent/config")[0][1]


def test_a_wandb_logger_gets_prudents_rows_in_its_own_run(
        home: Path, wandb_offline: Path) -> None:
    import wandb

    from tests.tracking.wandb_files import offline_runs

    logger = L.pytorch.loggers.WandbLogger(project="lit", save_dir=str(wandb_offline),
                                           offline=True)
    run = fit(home, "lit-wb", logger)
    assert wandb.run is logger.experiment  # prudent did not finish it
    wandb.finish()
    (found,) = offline_runs(wandb_offline)  # one W&B run: Lightning's
    assert found.run_id == logger.experiment.id
    losses = [row["prudent/step"] for row in found.history.values() if "prudent/loss" in row]
    assert losses == list(range(1, STEPS + 1))
    assert sum("train_loss" in row for row in found.history.values()) == STEPS
    summary = found.summary
    assert summary["prudent/verdict"].startswith(f"run {run.context.id} completed, {STEPS} steps")
    assert "[lifecycle/end] completed" in summary["prudent/events"]
    assert found.config["lr"] == 0.1


@pytest.mark.slow  # the session's mlflow server takes ~20 s to start
def test_an_mlflow_logger_gets_prudents_rows_in_its_own_run_and_ends_it_itself(
        home: Path, mlflow_server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from mlflow import MlflowClient

    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)  # the logger sets it: put back

    logger = L.pytorch.loggers.MLFlowLogger(experiment_name="lit", tracking_uri=mlflow_server)
    run = fit(home, "lit-mlf", logger)
    client = MlflowClient(mlflow_server)
    (found,) = client.search_runs([client.get_experiment_by_name("lit").experiment_id])
    assert found.info.run_id == logger.run_id  # one MLflow run: Lightning's
    assert found.info.status == "FINISHED"  # ended by Lightning's finalize
    history = client.get_metric_history(logger.run_id, "prudent/loss")
    assert [m.step for m in history] == list(range(1, STEPS + 1))
    assert len(client.get_metric_history(logger.run_id, "train_loss")) == STEPS
    tags = found.data.tags
    assert tags["prudent.run_id"] == run.context.id
    assert tags["prudent.verdict"].startswith(f"run {run.context.id} completed, {STEPS} steps")
    assert tags["prudent.event.lifecycle.end"] == "completed"


def test_a_tensorboard_configured_in_prudent_yaml_wins_over_the_loggers(
        home: Path, tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tests.tracking.test_tensorboard import read

    logger = L.pytorch.loggers.TensorBoardLogger(str(tmp_path / "tb"), name="lit")
    run = fit(home, "lit-tb-own", logger,
              tracking={"tensorboard": {"logdir": str(tmp_path / "mine")}})
    assert "prudent/loss" not in read(Path(logger.log_dir)).Tags()["scalars"]
    assert len(read(tmp_path / "mine" / run.context.id).Scalars("loss")) == STEPS


@pytest.mark.filterwarnings("ignore:There is a wandb run already in progress")
def test_a_wandb_run_the_script_started_and_the_logger_reuses_gets_prudents_rows_once(
        home: Path, wandb_offline: Path) -> None:
    import wandb

    from tests.tracking.wandb_files import offline_runs

    mine = wandb.init(project="lit")  # picked up at the run's start, under prudent's names
    logger = L.pytorch.loggers.WandbLogger(project="lit", save_dir=str(wandb_offline))
    fit(home, "lit-wb-twice", logger)
    assert logger.experiment is mine
    mine.finish()
    (found,) = offline_runs(wandb_offline)
    steps = [row["prudent/step"] for row in found.history.values() if "loss" in row]
    assert steps == list(range(1, STEPS + 1))  # each once: one sink for the one run
    assert not any("prudent/loss" in row for row in found.history.values())


def test_a_csv_logger_gets_prudents_numbers_in_its_metrics_csv(home: Path, tmp_path: Path) -> None:
    import csv

    logger = L.pytorch.loggers.CSVLogger(str(tmp_path / "csv"), name="lit")
    fit(home, "lit-csv", logger)
    assert [p.name for p in (tmp_path / "csv" / "lit").iterdir()] == ["version_0"]
    with (Path(logger.log_dir) / "metrics.csv").open(newline="") as file:
        rows = list(csv.DictReader(file))
    ours = [int(r["step"]) for r in rows if r["prudent/loss"]]
    assert ours == list(range(1, STEPS + 1))  # handed over by the training thread, in order
    assert [int(r["step"]) for r in rows if r["train_loss"]] == list(range(STEPS))  # Lightning's
    ends = [int(r["step"]) for r in rows if r["prudent/event/lifecycle"]]
    assert ends[-1] == STEPS  # the end's event: written after the last step, before finalize
    assert not any(r["prudent/loss"] and r["train_loss"] for r in rows)  # rows of their own
