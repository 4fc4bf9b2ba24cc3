"""FSDP2 state through torch.distributed.checkpoint, on every storage backend: shards out
and back, plain numbers in state.pt, every shard file hashed for the manifest, and a clear
error when the shards are gone or changed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from prudent.checkpoint.sharded import (
    METADATA_FILE,
    corrupted_shards,
    holds_shards,
    is_sharded_entry,
    load_sharded,
    missing_shards,
    save_sharded,
    shard_digests,
    sharded_objects,
)
from prudent.checkpoint.storage import CheckpointStorage, LocalStorage
from prudent.kernel.errors import ConfigError
from tests.fsdp2 import one_rank_mesh, sharded_mlp


def _train(model: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: int) -> None:
    for step in range(steps):
        torch.manual_seed(step)
        model(torch.randn(4, 8)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()


def _full(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.full_tensor().clone() for k, v in model.state_dict().items()}


def test_shards_saved_and_loaded_give_the_same_model_and_optimizer(
        tmp_path: Path, storage: CheckpointStorage) -> None:
    with one_rank_mesh(tmp_path) as mesh:
        _, model = sharded_mlp(mesh)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        _train(model, optimizer, 3)
        objects = {"model": model, "optimizer": optimizer, "plain": torch.nn.Linear(2, 2)}
        found = sharded_objects(objects)
        assert set(found) == {"model", "optimizer"} and found["optimizer"][0] is model
        kept, _ = save_sharded(found, storage, "ckpt-3.shards", None)
        assert all(is_sharded_entry(entry) for entry in kept.values())
        assert kept["optimizer"]["plain"] and not any(
            isinstance(v, torch.Tensor) for v in kept["optimizer"]["plain"].values())
        expected = _full(model)
        _train(model, optimizer, 2)  # moves on: the load must bring step 3 back
        load_sharded(found, kept, storage, None)
        for key, value in model.state_dict().items():
            assert torch.equal(value.full_tensor(), expected[key])
        assert all(state["step"].item() == 3 for state in optimizer.state.values())


def test_every_shard_file_is_hashed_and_a_changed_byte_is_found_by_its_ranks_share(
        tmp_path: Path, storage: CheckpointStorage) -> None:
    with one_rank_mesh(tmp_path) as mesh:
        _, model = sharded_mlp(mesh)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        _train(model, optimizer, 1)
        save_sharded(sharded_objects({"model": model, "optimizer": optimizer}), storage,
                     "ckpt-1.shards", None)
    digests = shard_digests(storage, "ckpt-1.shards")
    assert METADATA_FILE in digests and any(name.endswith(".distcp") for name in digests)
    assert missing_shards(storage, "ckpt-1.shards", digests) is None
    assert not corrupted_shards(storage, "ckpt-1.shards", digests, 0, 1)
    data = next(name for name in digests if name.endswith(".distcp"))
    content = bytearray(storage.read("ckpt-1.shards", data) or b"")
    content[len(content) // 2] ^= 0xFF  # one bit flip: the size stays
    storage.put("ckpt-1.shards", data, bytes(content))
    assert missing_shards(storage, "ckpt-1.shards", digests) is None
    shares = [corrupted_shards(storage, "ckpt-1.shards", digests, rank, 2) for rank in (0, 1)]
    # the file is in exactly one rank's share; each rank hashes the index it unpickles
    assert sorted(shares, key=len) == [[], [f"ckpt-1.shards/{data}"]]


def test_a_shards_folder_without_dcps_index_is_not_listed_as_written(
        tmp_path: Path, storage: CheckpointStorage) -> None:
    with one_rank_mesh(tmp_path) as mesh:
        _, model = sharded_mlp(mesh)
        save_sharded(sharded_objects({"model": model}), storage, "ckpt-1.shards", None)
    digests = shard_digests(storage, "ckpt-1.shards")
    storage.delete_file("ckpt-1.shards", METADATA_FILE)
    with pytest.raises(OSError, match=r"ckpt-1\.shards has no \.metadata"):
        shard_digests(storage, "ckpt-1.shards")
    assert missing_shards(storage, "ckpt-1.shards", digests) == \
        f"is missing its shard file ckpt-1.shards/{METADATA_FILE}"


def test_missing_shards_name_the_folder_and_the_fix(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path / "ckpts")
    with one_rank_mesh(tmp_path) as mesh:
        _, model = sharded_mlp(mesh)
        found = sharded_objects({"model": model})
        kept, _ = save_sharded(found, storage, "ckpt-1.shards", None)
        for path in (tmp_path / "ckpts" / "ckpt-1.shards").iterdir():
            path.unlink()
        with pytest.raises(ConfigError, match=r"ckpt-1\.shards.*remove that checkpoint"):
            load_sharded(found, kept, storage, None)


def test_a_plain_module_holds_no_shards() -> None:
    assert not holds_shards(torch.nn.Linear(2, 2))
    assert not holds_shards(torch.zeros(2))


def test_an_asynchronous_save_returns_before_the_write_and_is_what_the_model_was(
        tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path / "ckpts")
    with one_rank_mesh(tmp_path) as mesh:
        _, model = sharded_mlp(mesh)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        _train(model, optimizer, 2)
        found = sharded_objects({"model": model, "optimizer": optimizer})
        expected = _full(model)
        written: Any
        kept, written = save_sharded(found, storage, "ckpt-2.shards", None, asynchronous=True)
        _train(model, optimizer, 1)  # the loop goes on while the shards are written
        written.result()
        load_sharded(found, kept, storage, None)
        for key, value in model.state_dict().items():
            assert torch.equal(value.full_tensor(), expected[key])


def test_a_checkpoint_whose_shards_were_cut_short_is_skipped_for_the_one_before(
        tmp_path: Path) -> None:
    from prudent.checkpoint.storage import checkpoint_name
    from prudent.checkpoint.writer import CheckpointWriter, load_latest

    storage = LocalStorage(tmp_path / "ckpts")
    writer = CheckpointWriter(storage, keep=3, asynchronous=False)
    with one_rank_mesh(tmp_path) as mesh:
        _, model = sharded_mlp(mesh)
        for step in (1, 2):
            folder = checkpoint_name(step) + ".shards"
            kept, _ = save_sharded(sharded_objects({"model": model}), storage, folder, None)
            result = writer.save(step, {"objects": kept}, {}, synchronous=True, shards=folder)
            assert result is not None and result.error is None, result
    loaded = load_latest(storage)
    assert loaded is not None and loaded.name == checkpoint_name(2)
    assert METADATA_FILE in loaded.shards
    newest = tmp_path / "ckpts" / (checkpoint_name(2) + ".shards")
    shard = next(newest.glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:-10])
    loaded = load_latest(storage)
    assert loaded is not None and loaded.name == checkpoint_name(1)
    assert "truncated shard file" in loaded.skipped[0][1]


def test_a_rollback_to_a_sharded_checkpoint_puts_nothing_back_and_says_why(
        tmp_path: Path) -> None:
    import prudent
    from prudent.testing import make_settings

    settings = make_settings(tmp_path / "home", checkpoint={"every": "2steps", "mode": "sync"},
                             monitor={"enabled": False})
    with one_rank_mesh(tmp_path) as mesh:
        _, model = sharded_mlp(mesh)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        run = prudent.init(name="rollback", settings=settings, exit_on_stop=False)
        run.attach(model=model, optimizer=optimizer)
        with run:
            for step in run.steps(5):
                torch.manual_seed(step)
                loss = model(torch.randn(4, 8)).sum()
                run.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
                run.step(loss=loss)
            now = _full(model)
            service = run.context.checkpoints
            assert service.restore(run.context, before_step=5) is None
            assert "sharded (FSDP2)" in (service.cannot_restore or "")
            for key, value in _full(model).items():  # not half put back: nothing is
                assert torch.equal(value, now[key])
