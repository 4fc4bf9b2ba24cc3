from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

from prudent.checkpoint.storage import LocalStorage, open_storage
from prudent.checkpoint.writer import CheckpointWriter, load_latest
from prudent.kernel.errors import ConfigError


def payload(value: float, size: int = 10) -> dict[str, object]:
    return {"objects": {"w": torch.full((size,), value)}, "run": {"step": int(value)}}


@pytest.mark.parametrize("asynchronous", [False, True])
def test_saved_checkpoint_loads_back_with_manifest(tmp_path: Path, asynchronous: bool) -> None:
    writer = CheckpointWriter(LocalStorage(tmp_path), keep=2, asynchronous=asynchronous)
    writer.save(5, payload(5.0), {"epoch": 0})
    writer.close()
    loaded = load_latest(writer.storage)
    assert loaded is not None and loaded.name == "ckpt-0000000005" and not loaded.skipped
    assert torch.equal(loaded.payload["objects"]["w"], torch.full((10,), 5.0))
    manifest = json.loads((tmp_path / "ckpt-0000000005" / "manifest.json").read_text())
    assert manifest["step"] == 5 and len(manifest["files"]["state.pt"]["sha256"]) == 64


def test_snapshot_is_taken_before_the_tensor_changes(tmp_path: Path) -> None:
    writer = CheckpointWriter(LocalStorage(tmp_path), asynchronous=True)
    weights = torch.zeros(1_000_000)
    writer.save(1, {"objects": {"w": weights}}, {})
    weights.add_(1.0)  # the next optimizer step, while the write is still in flight
    writer.close()
    loaded = load_latest(writer.storage)
    assert loaded is not None and loaded.payload["objects"]["w"].sum().item() == 0.0


def test_keeps_the_last_k_and_never_the_only_one_less(tmp_path: Path) -> None:
    writer = CheckpointWriter(LocalStorage(tmp_path), keep=2, asynchronous=False)
    for step in (1, 2, 3, 4):
        result = writer.save(step, payload(float(step)), {})
    assert result is not None and result.deleted == ["ckpt-0000000002"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-0000000003", "ckpt-0000000004"]


@pytest.mark.parametrize("damage", ["truncate", "flip", "empty", "no_manifest"])
def test_damaged_newest_checkpoint_falls_back_to_the_previous_one(tmp_path: Path, damage: str) -> None:
    writer = CheckpointWriter(LocalStorage(tmp_path), keep=3, asynchronous=False)
    writer.save(1, payload(1.0, 100_000), {})
    writer.save(2, payload(2.0, 100_000), {})
    newest = tmp_path / "ckpt-0000000002"
    data = (newest / "state.pt").read_bytes()
    if damage == "truncate":
        (newest / "state.pt").write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        (newest / "state.pt").write_bytes(data[:1000] + bytes([data[1000] ^ 0xFF]) + data[1001:])
    elif damage == "empty":
        (newest / "state.pt").write_bytes(b"")
    else:
        (newest / "manifest.json").unlink()
    loaded = load_latest(writer.storage)
    assert loaded is not None and loaded.name == "ckpt-0000000001"
    assert loaded.skipped[0][0] == "ckpt-0000000002"
    assert loaded.payload["objects"]["w"][0].item() == 1.0


def test_file_that_matches_its_manifest_but_is_not_a_checkpoint_is_skipped(tmp_path: Path) -> None:
    writer = CheckpointWriter(LocalStorage(tmp_path), asynchronous=False)
    writer.save(1, payload(1.0), {})
    writer.save(2, {"objects": {"code": torch.nn.Linear}}, {})  # weights_only refuses classes
    loaded = load_latest(writer.storage)
    assert loaded is not None and loaded.name == "ckpt-0000000001"
    assert "cannot be deserialised safely" in loaded.skipped[0][1]


def test_only_damaged_checkpoints_give_an_empty_result_with_reasons(tmp_path: Path) -> None:
    writer = CheckpointWriter(LocalStorage(tmp_path), asynchronous=False)
    writer.save(1, payload(1.0), {})
    (tmp_path / "ckpt-0000000001" / "state.pt").write_bytes(b"garbage")
    loaded = load_latest(writer.storage)
    assert loaded is not None and loaded.payload == {} and "truncated" in loaded.skipped[0][1]


def test_staging_left_by_a_killed_save_is_ignored_and_cleaned(tmp_path: Path) -> None:
    (tmp_path / ".tmp-ckpt-0000000009-deadbeef").mkdir(parents=True)
    (tmp_path / ".tmp-ckpt-0000000009-deadbeef" / "state.pt").write_bytes(b"half")
    writer = CheckpointWriter(LocalStorage(tmp_path), asynchronous=False)
    assert load_latest(writer.storage) is None
    writer.save(1, payload(1.0), {})
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt-0000000001"]


def test_full_disk_keeps_the_previous_checkpoint_and_reports(tmp_path: Path) -> None:
    mount = tmp_path / "small-disk"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)],
                      capture_output=True).returncode != 0:
        pytest.skip("needs root to mount a small tmpfs")
    try:
        writer = CheckpointWriter(LocalStorage(mount / "ckpts"), keep=2, asynchronous=False)
        assert writer.save(1, payload(1.0, 100_000), {}).error is None  # 0.4 MB fits
        failed = writer.save(2, payload(2.0, 1_000_000), {})  # 4 MB does not
        assert failed is not None and failed.error is not None and "No space left" in failed.error
        loaded = load_latest(writer.storage)
        assert loaded is not None and loaded.name == "ckpt-0000000001" and not loaded.skipped
        assert not list((mount / "ckpts").glob(".tmp-*"))
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def test_unknown_url_scheme_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match="unknown scheme 'sftpx'"):
        open_storage("sftpx://host/path")


def test_saves_share_one_writer_thread_which_ends_with_close(tmp_path: Path) -> None:
    # a thread started per save made each save's caller wait for it to run (2-3 ms of stall)
    import threading

    writer = CheckpointWriter(LocalStorage(tmp_path), keep=5, asynchronous=True)
    seen: set[int] = set()
    for step in (1, 2, 3):
        writer.save(step, payload(float(step)), {})
        writer.wait()
        seen |= {t.ident for t in threading.enumerate() if t.name == "prudent-checkpoint-writer"}
        assert not writer.busy
    assert len(seen) == 1
    assert [r.step for r in writer.completed()] == [1, 2, 3]
    writer.close()
    assert not [t for t in threading.enumerate() if t.name == "prudent-checkpoint-writer"]
    writer.save(4, payload(4.0), {})  # a save after close starts a thread again
    writer.close()
    assert load_latest(writer.storage).name == "ckpt-0000000004"  # type: ignore[union-attr]


def test_a_save_whose_write_raises_does_not_stop_the_next_one(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    writer = CheckpointWriter(LocalStorage(tmp_path), asynchronous=True)
    failures: list[str] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: failures.append(str(args.exc_value)))
    original = writer._write
    monkeypatch.setattr(writer, "_write", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("bug")))
    writer.save(1, payload(1.0), {})
    writer.wait()  # returns: the thread told the error and waits for the next save
    assert failures == ["bug"] and not writer.busy
    monkeypatch.setattr(writer, "_write", original)
    writer.save(2, payload(2.0), {})
    writer.close()
    assert load_latest(writer.storage).name == "ckpt-0000000002"  # type: ignore[union-attr]
