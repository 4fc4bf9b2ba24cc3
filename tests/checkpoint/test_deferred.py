"""A framework's checkpoint file serialised by the writer's thread (Lightning's, Hugging Face's
live state): written as it was when the save began, whatever the loop does meanwhile."""

from __future__ import annotations

import io
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from prudent.adapters.files import FrameworkCheckpoint
from prudent.checkpoint.deferred import DeferredFile
from prudent.checkpoint.storage import LocalStorage
from prudent.checkpoint.writer import CheckpointWriter, load_latest


def _trained() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16),
                                torch.nn.Linear(16, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    _step(model, optimizer)
    return model, optimizer


def _step(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    model(torch.randn(4, 8)).square().mean().backward()
    optimizer.step()
    optimizer.zero_grad()


def _framework_file(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """What Lightning's dump_checkpoint hands its CheckpointIO: live tensors inside."""
    return {"state_dict": model.state_dict(), "optimizer_states": [optimizer.state_dict()],
            "hyper_parameters": {"lr": 0.1, "layers": [8, 16, 2]}, "epoch": 3}


def _serialiser_noting_its_thread(threads: list[str]) -> Any:
    def serialise(obj: Any) -> bytes:
        threads.append(threading.current_thread().name)
        buffer = io.BytesIO()
        torch.save(obj, buffer)
        return buffer.getvalue()

    return serialise


def _written_file(storage: LocalStorage) -> dict[str, Any]:
    loaded = load_latest(storage)
    assert loaded is not None and not loaded.skipped
    data = loaded.payload["objects"]["framework"]["files"]["model.ckpt"]
    assert data.dtype == torch.uint8  # stored as the framework's bytes, as ever
    return torch.load(io.BytesIO(data.numpy().tobytes()), weights_only=True)


def test_the_file_is_written_as_it_was_when_the_save_began(tmp_path: Path) -> None:
    model, optimizer = _trained()
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    momentum = [s["momentum_buffer"].clone() for s in optimizer.state.values()]
    threads: list[str] = []
    serialise = _serialiser_noting_its_thread(threads)

    writer = CheckpointWriter(LocalStorage(tmp_path), asynchronous=True)
    deferred = DeferredFile(_framework_file(model, optimizer), serialise)
    writer.save(1, {"objects": {"framework": {"entry": "model.ckpt",
                                              "files": {"model.ckpt": deferred}}}}, {})
    for _ in range(3):  # the loop trains on while the writer works
        _step(model, optimizer)
    writer.close()

    assert threads == ["prudent-checkpoint-writer"]  # not the training thread
    written = _written_file(writer.storage)
    assert written["epoch"] == 3 and written["hyper_parameters"]["layers"] == [8, 16, 2]
    assert set(written["state_dict"]) == set(expected)
    for name, value in expected.items():
        assert torch.equal(written["state_dict"][name], value), name
    assert hasattr(written["state_dict"], "_metadata")  # the module's versions, kept
    saved_momentum = [s["momentum_buffer"] for s in written["optimizer_states"][0]["state"].values()]
    assert all(torch.equal(a, b) for a, b in zip(saved_momentum, momentum, strict=True))
    # and the model has moved on since: the file is the save's step, not the newest one
    assert not torch.equal(model.state_dict()["0.weight"], expected["0.weight"])


def test_a_synchronous_save_serialises_the_live_file_at_once(tmp_path: Path) -> None:
    model, optimizer = _trained()
    expected = model.state_dict()["2.bias"].clone()
    writer = CheckpointWriter(LocalStorage(tmp_path), asynchronous=False)
    writer.save(1, {"objects": {"framework": {
        "entry": "model.ckpt", "files": {"model.ckpt": DeferredFile(_framework_file(model, optimizer))}}}}, {})
    _step(model, optimizer)
    assert torch.equal(_written_file(writer.storage)["state_dict"]["2.bias"], expected)


def test_a_file_the_snapshot_cannot_copy_is_serialised_at_once_on_the_training_thread(
        tmp_path: Path) -> None:
    # a sparse tensor has no host buffer of its shape: the whole file is made as the save
    # begins (as before deferral), so the loop's changes after it are not in it either
    dense = torch.zeros(4)
    threads: list[str] = []
    serialise = _serialiser_noting_its_thread(threads)

    obj = {"sparse": torch.eye(3).to_sparse(), "dense": dense}
    writer = CheckpointWriter(LocalStorage(tmp_path), asynchronous=True)
    writer.save(1, {"objects": {"framework": {"entry": "model.ckpt", "files": {
        "model.ckpt": DeferredFile(obj, serialise)}}}}, {})
    dense.add_(1.0)
    writer.close()
    assert threads == [threading.current_thread().name]
    written = _written_file(writer.storage)
    assert torch.equal(written["dense"], torch.zeros(4))
    assert torch.equal(written["sparse"].to_dense(), torch.eye(3))


@pytest.mark.parametrize("deferred", [False, True])
def test_framework_checkpoint_hands_the_writer_its_object_and_everyone_else_bytes(
        tmp_path: Path, deferred: bool) -> None:
    model, optimizer = _trained()
    framework = FrameworkCheckpoint(tmp_path)
    framework.bind(lambda folder: None, in_memory=lambda: {
        "model.ckpt": DeferredFile(_framework_file(model, optimizer)), "notes.txt": b"kept"})
    state = framework.deferred_state_dict() if deferred else framework.state_dict()
    assert state["entry"] == "model.ckpt"
    assert isinstance(state["files"]["model.ckpt"], DeferredFile) is deferred
    assert bytes(state["files"]["notes.txt"].numpy()) == b"kept"
    if not deferred:  # failure bundles and torchft's state get the bytes themselves
        loaded = torch.load(io.BytesIO(state["files"]["model.ckpt"].numpy().tobytes()),
                            weights_only=True)
        assert torch.equal(loaded["state_dict"]["0.weight"], model.state_dict()["0.weight"])
