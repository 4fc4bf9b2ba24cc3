"""FSDP2 state through torch.distributed.checkpoint: shards out and back, plain numbers in
state.pt, and a clear error when the shards are gone."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from prudent.checkpoint.sharded import (
    holds_shards,
    is_sharded_entry,
    load_sharded,
    save_sharded,
    sharded_objects,
)
from prudent.errors import ConfigError
from tests.fsdp2 import one_rank_mesh, sharded_mlp


def _train(model: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: int) -> None:
    for step in range(steps):
        torch.manual_seed(step)
        model(torch.randn(4, 8)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()


def test_shards_saved_and_loaded_give_the_same_model_and_optimizer(tmp_path: Path) -> None:
    with one_rank_mesh(tmp_path) as mesh:
        _, model = sharded_mlp(mesh)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        _train(model, optimizer, 3)
        objects = {"model": model, "optimizer": optimizer, "plain": torch.nn.Linear(2, 2)}
        found = sharded_objects(objects)
        assert set(found) == {"model", "optimizer"} and found["optimizer"][0] is model
        kept, _ = save_sharded(found, str(tmp_path / "ckpt-3.shards"), None)
        assert all(is_sharded_entry(entry) for entry in kept.values())
        assert kept["optimizer"]["plain"] and not any(
            isinstance(v, torch.Tensor) for v in kept["optimizer"]["plain"].values())
        expected = {k: v.full_tensor().clone() for k, v in model.state_dict().items()}
        _train(model, optimizer, 2)  # moves on: the load must bring step 3 back
        load_sharded(found, kept, str(tmp_path), None)
        for key, value in model.state_dict().items():
            assert torch.equal(value.full_tensor(), expected[key])
        assert all(state["step"].item() == 3 for state in optimizer.state.values())


def test_missing_shards_name_the_folder_and_the_fix(tmp_path: Path) -> None:
    with one_rank_mesh(tmp_path) as mesh:
        _, model = sharded_mlp(mesh)
        found = sharded_objects({"model": model})
        kept, _ = save_sharded(found, str(tmp_path / "ckpt-1.shards"), None)
        for path in (tmp_path / "ckpt-1.shards").iterdir():
            path.unlink()
        with pytest.raises(ConfigError, match=r"ckpt-1\.shards.*remove that checkpoint"):
            load_sharded(found, kept, str(tmp_path), None)


def test_a_plain_module_holds_no_shards() -> None:
    assert not holds_shards(torch.nn.Linear(2, 2))
    assert not holds_shards(torch.zeros(2))


def test_an_asynchronous_save_returns_before_the_write_and_is_what_the_model_was(
        tmp_path: Path) -> None:
    with one_rank_mesh(tmp_path) as mesh:
        _, model = sharded_mlp(mesh)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        _train(model, optimizer, 2)
        found = sharded_objects({"model": model, "optimizer": optimizer})
        expected = {k: v.full_tensor().clone() for k, v in model.state_dict().items()}
        kept, written = save_sharded(found, str(tmp_path / "ckpt-2.shards"), None,
                                     asynchronous=True)
        _train(model, optimizer, 1)  # the loop goes on while the shards are written
        written.result()
        load_sharded(found, kept, str(tmp_path), None)
        for key, value in model.state_dict().items():
            assert torch.equal(value.full_tensor(), expected[key])
