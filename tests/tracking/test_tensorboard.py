"""TensorBoard: prudent's metrics, config, events and end in real event files, read back with
TensorBoard's own EventAccumulator; a resumed run purges the steps it does again."""

from __future__ import annotations

from pathlib import Path

import pytest

import prudent
from prudent.testing import make_settings
from prudent.tracking.base import RunInfo
from prudent.tracking.settings import TensorBoardSettings
from prudent.wiring.config import ProjectSettings

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import (  # noqa: E402
    EventAccumulator,
)

from prudent.tracking.tensorboard import TensorBoardSink  # noqa: E402


def read(logdir: Path) -> EventAccumulator:
    accumulator = EventAccumulator(str(logdir), size_guidance={"scalars": 0, "tensors": 0})
    accumulator.Reload()
    return accumulator


def texts(accumulator: EventAccumulator, tag: str) -> list[tuple[int, str]]:
    return [(e.step, e.tensor_proto.string_val[0].decode())
            for e in accumulator.Tensors(f"{tag}/text_summary")]


def train(settings: ProjectSettings, steps: int) -> str:
    import torch

    run = prudent.init(name="tb", config={"lr": 0.5, "model": {"hidden": 4}},
                       settings=settings, exit_on_stop=False)
    weight = torch.zeros(1, requires_grad=True)
    with run:
        for _ in run.epochs(1):
            for _ in run.batches(range(steps)):
                loss = (weight - 1).pow(2).sum()
                run.backward(loss)
                with torch.no_grad():
                    weight -= run.config["lr"] * weight.grad
                    weight.grad = None
                run.step(loss=loss)
            run.log(val_acc=0.75)
    return run.context.id


def test_tensorboard_shows_metrics_per_step_config_events_and_summary(home: Path) -> None:
    logdir = home.parent / "tb"
    settings = make_settings(home, tracking={"tensorboard": {"logdir": str(logdir)}})
    run_id = train(settings, steps=12)
    board = read(logdir / run_id)
    losses = board.Scalars("loss")
    assert [s.step for s in losses] == list(range(1, 13))
    assert losses[0].value == 1.0 and losses[-1].value < 1e-6  # lr 0.5 on (w-1)^2 lands at once
    assert [(s.step, s.value) for s in board.Scalars("val_acc")] == [(12, 0.75)]
    (config,) = texts(board, "prudent/config")
    assert "| lr | 0.5 |" in config[1] and "| model.hidden | 4 |" in config[1]
    events = texts(board, "prudent/events")
    assert (12, "[lifecycle/end] completed") in events
    assert any(text.startswith("[profile/summary] profile: 12 steps") for _, text in events)
    assert [s.step for s in board.Scalars("prudent/event/lifecycle")][-1] == 12
    ((step, summary),) = texts(board, "prudent/summary")
    assert step == 12 and "**status**: completed" in summary and "**verdict**: run" in summary


def rows(steps: range, value: float) -> list[dict[str, float]]:
    return [{"step": s, "name": "loss", "value": value + s, "wall": 1e9 + s} for s in steps]


def test_resumed_tensorboard_run_purges_the_steps_it_does_again(tmp_path: Path) -> None:
    info = RunInfo(run_id="r1", name="r", run_dir=tmp_path / "run")
    settings = TensorBoardSettings(logdir=str(tmp_path / "tb"))
    first = TensorBoardSink(settings, info)  # killed after step 30, checkpoint at step 20
    first.write_metrics(rows(range(1, 31), 0.0))
    first.close("failed")
    second = TensorBoardSink(settings, info)
    second.write_events([{"step": 20, "kind": "checkpoint", "name": "resumed", "message": "from 20",
                          "payload": "{}", "wall": 2e9}])
    second.write_metrics(rows(range(21, 41), 100.0))
    second.close("completed")
    losses = read(tmp_path / "tb" / "r1").Scalars("loss")
    assert [s.step for s in losses] == list(range(1, 41))  # one curve: no step twice
    assert [s.value for s in losses] == [float(s) for s in range(1, 21)] + [
        100.0 + s for s in range(21, 41)]  # the steps done again: the second attempt's values
    assert texts(read(tmp_path / "tb" / "r1"), "prudent/events") == [
        (20, "[checkpoint/resumed] from 20")]


def test_a_resumed_run_purges_from_the_step_after_its_checkpoint_whatever_it_writes_first(
        tmp_path: Path) -> None:
    # purged from the first row's step, an evaluation the relaunch does again at the
    # checkpoint's step (or any row below it) dropped every tag of the steps before it
    info = RunInfo(run_id="r3", name="r", run_dir=tmp_path / "run")
    settings = TensorBoardSettings(logdir=str(tmp_path / "tb"))
    first = TensorBoardSink(settings, info)
    first.write_metrics(rows(range(1, 31), 0.0))
    first.close("failed")
    second = TensorBoardSink(settings, info)
    second.write_events([{"step": 20, "kind": "checkpoint", "name": "resumed", "message": "from 20",
                          "payload": "{}", "wall": 2e9}])
    second.write_metrics([{"step": 20, "name": "val_loss", "value": 0.5, "wall": 2e9},
                          *rows(range(21, 41), 100.0)])
    second.close("completed")
    board = read(tmp_path / "tb" / "r3")
    assert [s.step for s in board.Scalars("loss")] == list(range(1, 41))
    assert [(s.step, s.value) for s in board.Scalars("val_loss")] == [(20, 0.5)]


def test_first_attempt_does_not_purge_and_events_before_metrics_are_kept(tmp_path: Path) -> None:
    info = RunInfo(run_id="r2", name="r", run_dir=tmp_path / "run")
    sink = TensorBoardSink(TensorBoardSettings(logdir=str(tmp_path / "tb")), info)
    sink.write_config({"lr": 0.1})
    sink.write_events([{"step": 0, "kind": "cost", "name": "price", "message": "$0",
                        "payload": "{}", "wall": 1e9}])
    sink.write_metrics(rows(range(5, 8), 0.0))
    sink.close("completed")
    board = read(tmp_path / "tb" / "r2")
    assert [s.step for s in board.Scalars("loss")] == [5, 6, 7]
    assert texts(board, "prudent/events") == [(0, "[cost/price] $0")]
    assert texts(board, "prudent/config")[0][0] == 0


def test_a_summary_writer_given_to_attach_gets_prudents_rows_beside_the_scripts(
        home: Path) -> None:
    """No `tracking:` settings: the script's own SummaryWriter, passed to run.attach, gets
    prudent's metrics and events beside the script's own scalars; it is not checkpointed, and
    the script closes it."""
    import torch
    from torch.utils.tensorboard import SummaryWriter

    logdir = home.parent / "mine"
    writer = SummaryWriter(str(logdir))
    run = prudent.init(name="tb-own", settings=make_settings(home), exit_on_stop=False)
    weight = torch.zeros(1, requires_grad=True)
    run.attach(weight=weight, tb=writer)
    assert list(run.context.objects) == ["weight"]  # the writer is no state to save
    with run:
        for _ in run.epochs(1):
            for _ in run.batches(range(8)):
                loss = (weight - 1).pow(2).sum()
                run.backward(loss)
                with torch.no_grad():
                    weight -= 0.1 * weight.grad
                    weight.grad = None
                run.step(loss=loss)
                writer.add_scalar("mine/loss", loss.item(), run.state.step)
    writer.add_scalar("mine/after", 1.0, 9)  # still the script's to use, and to close
    writer.close()
    board = read(logdir)
    assert [s.step for s in board.Scalars("loss")] == list(range(1, 9))
    assert [s.step for s in board.Scalars("mine/loss")] == list(range(1, 9))
    assert board.Scalars("mine/after")[0].step == 9
    events = [text for _, text in texts(board, "prudent/events")]
    assert any(text.startswith("[lifecycle/end] completed") for text in events), events
    assert texts(board, "prudent/config") and "completed" in texts(board, "prudent/summary")[0][1]


def test_a_summary_writer_given_to_attach_is_written_to_beside_a_configured_tensorboard(
        home: Path) -> None:
    import torch
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(home.parent / "mine"))
    settings = make_settings(home, tracking={"tensorboard": {"logdir": str(home.parent / "tb")}})
    run = prudent.init(name="tb-both", settings=settings, exit_on_stop=False)
    run.attach(weight=torch.zeros(1), tb=writer)
    with run:
        for step in run.steps(4):
            run.step(loss=float(step))
    writer.close()
    assert len(read(home.parent / "mine").Scalars("loss")) == 4
    assert len(read(home.parent / "tb" / run.context.id).Scalars("loss")) == 4
