"""One suite, every storage backend: a local folder, fsspec's memory filesystem, and S3 on a
real S3-compatible server (moto's) started on loopback — not a mocked client."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from prudent.checkpoint.storage import CheckpointStorage, FsspecStorage, LocalStorage, open_storage
from prudent.checkpoint.writer import CheckpointWriter, load_latest


def test_backend_is_the_one_the_url_names(storage: CheckpointStorage) -> None:
    expected = LocalStorage if "://" not in storage.url else FsspecStorage
    assert isinstance(storage, expected)


def test_round_trip_retention_and_fallback(storage: CheckpointStorage) -> None:
    writer = CheckpointWriter(storage, keep=2, asynchronous=True)
    for step in (10, 20, 30):
        writer.save(step, {"objects": {"w": torch.full((1000,), float(step))}}, {"epoch": 0})
    writer.close()
    assert all(r.error is None for r in writer.completed())
    assert storage.checkpoints() == ["ckpt-0000000030", "ckpt-0000000020"]
    loaded = load_latest(storage)
    assert loaded is not None and loaded.name == "ckpt-0000000030"
    assert loaded.payload["objects"]["w"][0].item() == 30.0
    # an interrupted upload/write of a newer checkpoint: data but no manifest
    handle = storage.begin("ckpt-0000000040")
    stream = storage.open_write(handle, "state.pt")
    stream.write(b"half of a checkpoint")
    stream.close()
    if isinstance(storage, FsspecStorage):  # object stores have no rename: it is visible
        loaded = load_latest(storage)
        assert loaded is not None and loaded.name == "ckpt-0000000030"
        assert loaded.skipped == [("ckpt-0000000040", "has no manifest (the save never finished)")]
    else:
        storage.abort(handle)


def test_shards_one_writer_wrote_round_trip_and_a_changed_one_falls_back(
        storage: CheckpointStorage) -> None:
    """The path every model takes: DCP shards beside the checkpoint, written once by the
    writer thread, retained with it, hashed at load (a changed byte: the one before)."""
    writer = CheckpointWriter(storage, keep=2, asynchronous=True)
    for step in (10, 20, 30):
        folder = f"ckpt-{step:010d}.shards"
        writer.save(step, {"objects": {}}, {}, shards=folder,
                    tensors={"model/w": torch.full((1000,), float(step))})
    writer.close()
    assert all(r.error is None for r in writer.completed())
    assert sorted(n for n in storage.names() if n.endswith(".shards")) == [
        "ckpt-0000000020.shards", "ckpt-0000000030.shards"]  # retained with their checkpoints
    loaded = load_latest(storage)
    assert loaded is not None and loaded.name == "ckpt-0000000030" and loaded.shards_checked
    data = bytearray(storage.read("ckpt-0000000030.shards", "__0_0.distcp") or b"")
    data[len(data) // 2] ^= 0xFF
    storage.put("ckpt-0000000030.shards", "__0_0.distcp", bytes(data))
    loaded = load_latest(storage)
    assert loaded is not None and loaded.name == "ckpt-0000000020"
    assert loaded.skipped[0][1].startswith("is corrupted (checksum mismatch of ckpt-0000000030.shards/")


def test_missing_root_lists_nothing(tmp_path: Path) -> None:
    assert open_storage(str(tmp_path / "none")).checkpoints() == []
    assert load_latest(open_storage(f"memory://nothing-{os.getpid()}")) is None


def test_put_replaces_a_small_file_whole_and_files_lists_it(storage: CheckpointStorage) -> None:
    assert storage.files("record") == []
    storage.put("record", "heartbeat-a.json", b"first")
    storage.put("record", "heartbeat-a.json", b"second, longer")
    storage.put("record", "seg-a-000000.json.gz", b"segment")
    assert sorted(storage.files("record")) == ["heartbeat-a.json", "seg-a-000000.json.gz"]
    assert storage.read("record", "heartbeat-a.json") == b"second, longer"
    assert storage.checkpoints() == []  # the record is not a checkpoint: retention leaves it


def test_read_many_reads_each_file_and_none_for_a_missing_one(storage: CheckpointStorage) -> None:
    for i in range(5):
        storage.put("record", f"seg-{i}", bytes([i]) * 10)
    found = storage.read_many("record", [*(f"seg-{i}" for i in range(5)), "missing"])
    assert found == {**{f"seg-{i}": bytes([i]) * 10 for i in range(5)}, "missing": None}


def test_a_writable_location_passes_the_probe_and_keeps_no_trace(storage: CheckpointStorage) -> None:
    storage.check_writable()
    assert storage.names() == []


def test_a_bucket_that_does_not_exist_stops_the_run_before_it_trains(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, s3_endpoint: str) -> None:
    # a typo in the bucket: before, the run trained to the end with every save failed (exit 0,
    # no checkpoint), and a new machine started it again from step 0
    import prudent
    from prudent.kernel.errors import ConfigError
    from prudent.testing import make_settings

    for var, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1", "PRUDENT_S3_ENDPOINT_URL": s3_endpoint}.items():
        monkeypatch.setenv(var, value)
    settings = make_settings(tmp_path, checkpoint={"url": "s3://no-such-bucket-here/runs"})
    with pytest.raises(ConfigError) as error:
        prudent.init(name="typo", settings=settings, exit_on_stop=False)  # before any step
    message = str(error.value)
    assert "s3://no-such-bucket-here/runs" in message and "checkpoint.url" in message


def test_delete_file_removes_one_file_and_ignores_a_missing_one(storage: CheckpointStorage) -> None:
    storage.put(".nodes", "a-node0", b"")
    storage.put(".nodes", "a-node1", b"")
    storage.delete_file(".nodes", "a-node0")
    storage.delete_file(".nodes", "never-there")
    assert storage.files(".nodes") == ["a-node1"]
    assert storage.checkpoints() == []  # the marks' folder is no checkpoint
