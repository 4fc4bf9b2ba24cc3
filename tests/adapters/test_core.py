"""The framework-neutral half of the adapters: AdapterRun, FrameworkCheckpoint, ResumableLoader."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from prudent.adapters.core import AdapterRun
from prudent.adapters.files import FrameworkCheckpoint
from prudent.adapters.loader import ResumableLoader
from prudent.store.database import Store
from prudent.testing import StopAtStep, make_settings


def _adapter(home: Path, exit_on_stop: bool = True, **config: object) -> AdapterRun:
    settings = make_settings(home, console={"mode": "off"})
    return AdapterRun("toy", "toy", config, exit_on_stop=exit_on_stop, settings=settings)


def test_framework_checkpoint_carries_a_folder_and_gives_it_back(tmp_path: Path) -> None:
    def write(folder: Path) -> Path:
        (folder / "ckpt" / "sub").mkdir(parents=True)
        (folder / "ckpt" / "model.bin").write_bytes(b"\x00weights")
        (folder / "ckpt" / "sub" / "state.json").write_text("{}")
        return folder / "ckpt"

    saving = FrameworkCheckpoint(tmp_path / "a")
    saving.bind(write)
    state = saving.state_dict()
    assert not (tmp_path / "a" / "saving").exists()  # the scratch files are gone
    restored = FrameworkCheckpoint(tmp_path / "b")
    restored.load_state_dict(state)
    assert restored.restored is not None and (restored.restored / "model.bin").read_bytes() == \
        b"\x00weights" and (restored.restored / "sub" / "state.json").read_text() == "{}"
    # a save before the framework is set up carries the files it was restored from
    assert restored.state_dict() == state


def test_framework_checkpoint_keeps_carrying_the_restored_files_until_the_framework_writes(
        tmp_path: Path) -> None:
    state = {"entry": "ckpt", "files": {"ckpt/model.bin": b"old"}}
    carried = FrameworkCheckpoint(tmp_path)
    carried.load_state_dict(state)
    carried.bind(lambda folder: None)  # the framework has written nothing new yet
    assert carried.state_dict() == state


def test_carried_files_cost_their_own_size_in_a_checkpoint_and_come_back_whole(
        tmp_path: Path) -> None:
    # a framework's checkpoint is binary (zip, safetensors): carried as `bytes`, torch.save
    # (pickle protocol 2, what weights_only loading reads) wrote it as a latin-1 string, 1.5x
    import io
    import os

    data = os.urandom(200_000)
    saving = FrameworkCheckpoint(tmp_path / "a")
    saving.bind(lambda folder: None, in_memory=lambda: {"model.ckpt": data, "empty": b""})
    buffer = io.BytesIO()
    torch.save({"framework": saving.state_dict()}, buffer)
    assert buffer.tell() < 1.05 * len(data), buffer.tell()
    buffer.seek(0)
    restored = FrameworkCheckpoint(tmp_path / "b")
    restored.load_state_dict(torch.load(buffer, weights_only=True)["framework"])
    assert restored.restored is not None and restored.restored.read_bytes() == data
    assert (restored.restored.parent / "empty").read_bytes() == b""


def test_framework_checkpoint_refuses_a_path_outside_its_folder(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="points outside"):
        FrameworkCheckpoint(tmp_path).load_state_dict(
            {"entry": "x", "files": {"../../evil.py": b"print()"}})


def _loader() -> DataLoader:
    data = TensorDataset(torch.arange(40.0).unsqueeze(1))
    return DataLoader(data, batch_size=4, shuffle=True)  # the order comes from torch's RNG


def test_resumable_loader_continues_the_interrupted_epoch_batch_for_batch() -> None:
    torch.manual_seed(0)
    first = ResumableLoader(_loader())
    iterator = iter(first)
    seen = [next(iterator)[0] for _ in range(3)]
    state = first.state_dict()
    after = torch.rand(1)  # what the loop drew next (dropout, say)
    rest = [b[0] for b in iterator]
    torch.manual_seed(123)  # a new process: other generator states
    second = ResumableLoader(_loader())
    second.load_state_dict(state)
    resumed = [b[0] for b in second]
    assert len(seen) + len(rest) == 10 and len(resumed) == 7
    assert all(torch.equal(a, b) for a, b in zip(rest, resumed))
    torch.manual_seed(123)
    second.load_state_dict(state)
    next(iter(second))
    # once the skip is done the generators are as they were at the checkpoint
    assert torch.equal(torch.rand(1), after)


def test_resumable_loader_restored_between_epochs_draws_the_next_order_as_before() -> None:
    # a loader with its own generator, which the script seeds anew in a new process: restored
    # from a checkpoint between epochs 1 and 2, epoch 2 must come in the uninterrupted order
    def seeded() -> DataLoader:
        data = TensorDataset(torch.arange(40.0).unsqueeze(1))
        return DataLoader(data, batch_size=4, shuffle=True,
                          generator=torch.Generator().manual_seed(7))

    first = ResumableLoader(seeded())
    first.position = lambda: 0  # the epoch ended: the framework's count starts again
    list(first)
    state = first.state_dict()
    second_epoch = [b[0] for b in first]
    restored = ResumableLoader(seeded())
    restored.load_state_dict(state)
    resumed = [b[0] for b in restored]
    assert len(resumed) == 10 and all(torch.equal(a, b) for a, b in zip(second_epoch, resumed))


def _own_generator_loader() -> DataLoader:
    data = TensorDataset(torch.arange(40.0).unsqueeze(1))
    return DataLoader(data, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(7))


@pytest.mark.parametrize("trained", [0, 10])  # between epochs; after the last batch, not past it
def test_resumable_loader_saved_at_an_epochs_end_starts_the_next_epoch_in_its_order(
        trained: int) -> None:
    # Lightning never runs an epoch's iterator out (it stops at the epoch's length), and one
    # saved on the last batch's end resumes with the next epoch: the restored loader must give
    # that epoch's batches in the uninterrupted order, none skipped
    first = ResumableLoader(_own_generator_loader())
    first.position = lambda: trained
    iterator = iter(first)
    _ = [next(iterator) for _ in range(10)]
    state = first.state_dict()
    after = torch.rand(1)  # what the loop draws next
    second_epoch = [b[0] for b in first]
    torch.manual_seed(123)  # a new process
    restored = ResumableLoader(_own_generator_loader())
    restored.load_state_dict(state)
    resumed = [b[0] for b in restored]
    assert len(resumed) == 10 and all(torch.equal(a, b) for a, b in zip(second_epoch, resumed))
    if trained:  # torch's RNG as at the checkpoint (the loader draws from its own generator)
        torch.manual_seed(123)
        restored.load_state_dict(state)
        next(iter(restored))
        assert torch.equal(torch.rand(1), after)


def test_resumable_loader_counts_an_epoch_as_the_framework_does() -> None:
    # limit_train_batches=6 of 10: a checkpoint after the 6th batch is after the epoch's end
    first = ResumableLoader(_own_generator_loader())
    first.position, first.epoch_length = (lambda: 6), (lambda: 6)
    iterator = iter(first)
    _ = [next(iterator) for _ in range(6)]
    state = first.state_dict()
    assert state["epoch_batches"] == 6
    restored = ResumableLoader(_own_generator_loader())
    restored.load_state_dict(state)
    assert len(list(restored)) == 10  # the next epoch whole, not its last 4 batches


def test_resumable_loader_uses_the_trained_count_it_is_given() -> None:
    loader = ResumableLoader(_loader())
    iterator = iter(loader)
    next(iterator), next(iterator)  # a framework reads one batch ahead
    loader.position = lambda: 1
    assert loader.state_dict()["batches"] == 1 and len(loader) == 10
    assert loader.batch_size == 4  # the wrapped loader's attributes show through


def test_merge_hparams_overrides_the_framework_and_records_its_own_keys(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRUDENT_SET", '{"lr": 0.5}')
    adapter = _adapter(tmp_path, lr=0.1, epochs=2)
    changed = adapter.merge_hparams({"lr": 0.1, "hidden": 32, "epochs": 2, "act": torch.nn.ReLU()})
    assert changed == {"lr": 0.5}  # --set wins over what the framework was built with
    assert adapter.config == {"lr": 0.5, "epochs": 2, "hidden": 32}  # no module in the record
    adapter.finish()
    stored = Store.open(make_settings(tmp_path).store).get_run(adapter.ctx.id)
    assert stored is not None and stored["config"]["hidden"] == 32


def test_a_stop_is_announced_once_checkpointed_and_ends_with_its_exit_code(
        tmp_path: Path) -> None:
    adapter = _adapter(tmp_path)
    adapter.ctx.add_component(StopAtStep(2))
    assert adapter.step_end(loss=torch.tensor(1.0)) is None
    stop = adapter.step_end(loss=torch.tensor(0.9))
    assert stop is not None and str(stop) == "preempted"
    assert adapter.log(val_acc=0.5) is stop and adapter.epoch_end(0) is stop
    assert adapter.ctx.state.epoch == 0  # the stopped epoch did not end
    with pytest.raises(SystemExit) as exited:
        adapter.finish()
    assert exited.value.code == 75 and adapter.ctx.status == "stopped"
    events = Store.open(make_settings(tmp_path).store).events(adapter.ctx.id)
    names = [(e["kind"], e["name"]) for e in events]
    assert names.count(("lifecycle", "stop_requested")) == 1
    assert ("checkpoint", "saved") in names  # the stop saved at once


def test_without_exit_on_stop_finish_returns_and_the_run_says_why(tmp_path: Path) -> None:
    adapter = _adapter(tmp_path, exit_on_stop=False)
    adapter.ctx.request_stop("budget", "spent it")
    adapter.finish()
    assert adapter.run.stop_reason == "budget" and adapter.exit_code == 4


def test_a_completed_run_is_closed_with_exit_code_0(tmp_path: Path) -> None:
    adapter = _adapter(tmp_path)
    adapter.epoch_start(0, 1, 2)
    for _ in range(2):
        adapter.batch_loaded(torch.zeros(2))
        adapter.step_end(loss=torch.tensor(0.5))
    assert adapter.epoch_end(0) is None and adapter.log(val_acc=torch.tensor(0.75)) is None
    adapter.finish()
    assert (adapter.ctx.status, adapter.exit_code, adapter.ctx.state.step) == ("completed", 0, 2)
    assert adapter.ctx.latest["val_acc"] == 0.75
