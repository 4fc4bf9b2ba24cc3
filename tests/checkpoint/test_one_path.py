"""Models and optimizers are saved through DCP in one process too (the path DDP and FSDP2
take): shards written once by the writer, hashed like ``state.pt``, read back exactly."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

import prudent
from prudent.checkpoint.storage import LocalStorage
from prudent.checkpoint.writer import CheckpointWriter
from prudent.store.database import Store
from prudent.testing import StopAtStep, make_settings, tiny_loader, tiny_model
from prudent.wiring.config import ProjectSettings


@pytest.fixture(autouse=True)
def one_run_id(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRUDENT_RUN_ID", "one-path")  # a second start resumes the first


def settings_for(home: Path) -> ProjectSettings:
    return make_settings(home, monitor={"enabled": False},
                         checkpoint={"every": "10steps", "keep": 2, "at_epoch_end": False})


class WithUnusedLayer(torch.nn.Module):
    """A layer built but never used: its parameters want a gradient and never get one."""

    def __init__(self) -> None:
        super().__init__()
        self.body, self.unused = tiny_model(), torch.nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def train(home: Path, stop_at: int | None = None, order: str = "together",
          seen: dict[str, Any] | None = None) -> tuple[prudent.Run, torch.nn.Module, Any]:
    """32 steps of a tiny model with AdamW, its optimizer attached with the model, before it,
    or updating a head that is attached apart (``order``)."""
    torch.manual_seed(0)
    model = WithUnusedLayer() if order == "unused layer" else tiny_model()
    head = torch.nn.Linear(2, 2)
    params = [*model.parameters(), *head.parameters()] if order == "apart" else model.parameters()
    opt = torch.optim.AdamW(params, lr=0.01)
    run = prudent.init(name="one-path", settings=settings_for(home), exit_on_stop=False)
    if stop_at:
        run.context.add_component(StopAtStep(stop_at))
    if order == "optimizer first":
        run.attach(optimizer=opt)
        if seen is not None:  # nothing read yet: the model's shards are read with its own
            seen["optimizer state before the model"] = len(opt.state)
        run.attach(model=model)
    else:
        run.attach(model=model, optimizer=opt, **({"head": head} if order == "apart" else {}))
    with run:
        for _ in run.epochs(1):
            for x, y in run.batches(tiny_loader(num_samples=256, batch_size=8)):
                loss = F.cross_entropy(head(model(x)) if order == "apart" else model(x), y)
                run.backward(loss)
                opt.step()
                opt.zero_grad()
                run.step(loss=loss)
    return run, model, opt


def checkpoints_of(home: Path, run: prudent.Run) -> Path:
    return home / "runs" / run.id / "checkpoints"


def checkpoint_events(home: Path) -> dict[str, dict[str, Any]]:
    store = Store(f"sqlite:///{home / 'prudent.db'}")
    events = {e["name"]: e for e in store.events("one-path") if e["kind"] == "checkpoint"}
    store.close()
    return events


def test_one_process_writes_its_model_and_optimizer_once_as_dcp_shards(tmp_path: Path) -> None:
    home = tmp_path / ".prudent"
    run, model, opt = train(home)
    folder = checkpoints_of(home, run)
    assert sorted(p.name for p in folder.glob("ckpt-*")) == [
        "ckpt-0000000020", "ckpt-0000000020.shards", "ckpt-0000000030", "ckpt-0000000030.shards"]
    shards = folder / "ckpt-0000000030.shards"
    assert sorted(p.name for p in shards.iterdir()) == [".metadata", "__0_0.distcp"]
    manifest = json.loads((folder / "ckpt-0000000030" / "manifest.json").read_text())
    assert manifest["shards"]["by"] == "one"
    assert set(manifest["shards"]["files"]) == {".metadata", "__0_0.distcp"}
    # state.pt names the shards and keeps only plain numbers of the model and optimizer
    objects = torch.load(folder / "ckpt-0000000030" / "state.pt", weights_only=True)["objects"]
    assert not any(isinstance(v, torch.Tensor) for v in objects["model"]["plain"].values())
    assert objects["optimizer"]["plain"]["param_groups.0.weight.lr"] == 0.01
    # DCP's own tools read them: the weights by their names, AdamW's state by parameter name
    dcp_to_torch_save(shards, tmp_path / "whole.pt")
    whole = torch.load(tmp_path / "whole.pt", weights_only=True)
    assert set(whole) >= {"model/0.weight", "optimizer/state.0.weight.exp_avg",
                          "optimizer/state.0.weight.step"}
    assert float(whole["optimizer/state.0.weight.step"]) == 30.0


def test_a_resume_reads_the_shards_back_exactly(tmp_path: Path) -> None:
    _, straight, straight_opt = train(tmp_path / "straight")
    home = tmp_path / ".prudent"
    train(home, stop_at=15)  # stopped: saved at step 15 on the way out
    run, resumed, resumed_opt = train(home)
    assert checkpoint_events(home)["resumed"]["payload"]["checkpoint"] == "ckpt-0000000015"
    assert run.state.step == 32
    for a, b in zip(straight.parameters(), resumed.parameters(), strict=True):
        assert torch.equal(a, b)
    assert str(straight_opt.state_dict()) == str(resumed_opt.state_dict())


def test_a_corrupted_shard_is_skipped_for_the_checkpoint_before(tmp_path: Path) -> None:
    home = tmp_path / ".prudent"
    run, _, _ = train(home, stop_at=25)  # saved at 20 and (stopping) at 25
    shard = checkpoints_of(home, run) / "ckpt-0000000025.shards" / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte, same size: only the hash tells
    shard.write_bytes(bytes(data))
    run, _, _ = train(home)
    events = checkpoint_events(home)
    assert "ckpt-0000000025 is corrupted (checksum mismatch of ckpt-0000000025.shards/" \
           "__0_0.distcp)" in events["skipped"]["message"]
    assert events["resumed"]["payload"]["checkpoint"] == "ckpt-0000000020"
    assert run.state.step == 32


def test_an_optimizer_attached_before_its_model_is_restored_with_it(tmp_path: Path) -> None:
    _, _, straight_opt = train(tmp_path / "straight")
    home = tmp_path / ".prudent"
    train(home, stop_at=15, order="optimizer first")
    seen: dict[str, Any] = {}
    _, _, resumed_opt = train(home, order="optimizer first", seen=seen)
    assert checkpoint_events(home)["resumed"]["payload"]["checkpoint"] == "ckpt-0000000015"
    assert seen["optimizer state before the model"] == 0
    assert str(straight_opt.state_dict()) == str(resumed_opt.state_dict())


def test_an_optimizer_over_two_attached_modules_is_saved_whole_and_resumes(tmp_path: Path) -> None:
    _, straight, straight_opt = train(tmp_path / "straight", order="apart")
    home = tmp_path / ".prudent"
    run, _, _ = train(home, stop_at=15, order="apart")
    objects = torch.load(checkpoints_of(home, run) / "ckpt-0000000015" / "state.pt",
                         weights_only=True)["objects"]
    assert set(objects["optimizer"]) == {"state", "param_groups"}  # its own state_dict()
    _, resumed, resumed_opt = train(home, order="apart")
    assert checkpoint_events(home)["resumed"]["payload"]["checkpoint"] == "ckpt-0000000015"
    assert all(torch.equal(a, b) for a, b in zip(straight.parameters(), resumed.parameters(),
                                                 strict=True))
    assert str(straight_opt.state_dict()) == str(resumed_opt.state_dict())


def test_retention_removes_the_shards_of_a_save_that_never_committed(tmp_path: Path) -> None:
    writer = CheckpointWriter(LocalStorage(tmp_path), keep=1, asynchronous=False)
    tensors = {"model/w": torch.ones(4)}
    writer.save(10, {"objects": {}}, {}, shards="ckpt-0000000010.shards", tensors=tensors)
    (tmp_path / "ckpt-0000000015.shards").mkdir()  # killed between its shards and its manifest
    (tmp_path / "ckpt-0000000015.shards" / "__0_0.distcp").write_bytes(b"half")
    writer.save(20, {"objects": {}}, {}, shards="ckpt-0000000020.shards", tensors=tensors)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-0000000020",
                                                          "ckpt-0000000020.shards"]


def test_an_optimizer_without_state_for_an_unused_layer_resumes_exactly(tmp_path: Path) -> None:
    """AdamW has no state for parameters that never got a gradient; a fresh optimizer asked
    for its state dict makes some up for every parameter, which the checkpoint lacks (the
    resume crashed: "Missing key in checkpoint state_dict: optimizer/state.unused.bias...")."""
    _, straight, straight_opt = train(tmp_path / "straight", order="unused layer")
    home = tmp_path / ".prudent"
    train(home, stop_at=15, order="unused layer")
    _, resumed, resumed_opt = train(home, order="unused layer")
    assert checkpoint_events(home)["resumed"]["payload"]["checkpoint"] == "ckpt-0000000015"
    assert len(resumed_opt.state) == 4  # the body's weights and biases, not the unused layer's
    assert all(torch.equal(a, b) for a, b in zip(straight.parameters(), resumed.parameters(),
                                                 strict=True))
    assert str(straight_opt.state_dict()) == str(resumed_opt.state_dict())
