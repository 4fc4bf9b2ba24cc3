"""A checkpoint holding NaN or infinity is never committed; keep-K never loses the good ones."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import prudent
from prudent.checkpoint import Checkpointer
from prudent.checkpoint.finite import first_non_finite
from prudent.checkpoint.settings import CheckpointSettings
from prudent.checkpoint.storage import LocalStorage
from prudent.checkpoint.writer import CheckpointWriter, load_latest
from prudent.store.database import Store
from prudent.testing import make_settings, tiny_loader, tiny_model


def payload(value: float) -> dict[str, object]:
    return {"objects": {"model": {"w": torch.full((4,), value), "b": torch.zeros(2)},
                        "optimizer": {"state": {3: {"exp_avg": torch.ones(4), "step": 5}}}},
            "run": {"rng": torch.zeros(8, dtype=torch.uint8)}}


def test_first_non_finite_names_the_tensor_and_passes_finite_ones() -> None:
    good = payload(1.0)
    assert first_non_finite(good) is None
    good["objects"]["optimizer"]["state"][3]["exp_avg"][2] = float("inf")  # type: ignore[index]
    assert first_non_finite(good) == "objects.optimizer.state.3.exp_avg"
    assert first_non_finite({"w": torch.full((3,), 6e4, dtype=torch.float16)}) is None  # norm > fp16 max
    assert first_non_finite({"w": torch.tensor([1.0, float("nan")], dtype=torch.bfloat16)}) == "w"


@pytest.mark.parametrize("asynchronous", [False, True])
def test_a_nan_snapshot_is_not_committed_and_the_good_ones_stay(tmp_path: Path,
                                                                asynchronous: bool) -> None:
    writer = CheckpointWriter(LocalStorage(tmp_path), keep=1, asynchronous=asynchronous)
    writer.save(10, payload(1.0), {})
    writer.close()
    result = writer.save(20, payload(float("nan")), {})
    writer.close()
    result = result or writer.completed()[-1]
    assert result.not_finite == "objects.model.w" and result.path == ""
    assert writer.storage.checkpoints() == ["ckpt-0000000010"]  # keep=1 kept the good one
    loaded = load_latest(writer.storage)
    assert loaded is not None and loaded.name == "ckpt-0000000010"


def test_retention_never_deletes_a_pinned_checkpoint(tmp_path: Path) -> None:
    writer = CheckpointWriter(LocalStorage(tmp_path), keep=1, asynchronous=False)
    writer.save(10, payload(1.0), {})
    writer.pinned = {"ckpt-0000000010"}
    for step in (20, 30, 40):
        writer.save(step, payload(float(step)), {})
    assert writer.storage.checkpoints() == ["ckpt-0000000040", "ckpt-0000000010"]


def test_a_periodic_save_after_the_weights_went_nan_is_refused_with_an_event(tmp_path: Path) -> None:
    home = tmp_path / ".prudent"
    settings = make_settings(home, monitor={"enabled": False},
                             checkpoint={"every": "10steps", "keep": 1, "at_epoch_end": False})
    run = prudent.init(name="poison", settings=settings, exit_on_stop=False,
                       components=[Checkpointer(CheckpointSettings(every="10steps", keep=1,
                                                                   at_epoch_end=False))])
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    run.attach(model=model, optimizer=opt)
    with run:
        for _ in run.epochs(1):
            for x, y in run.batches(tiny_loader(num_samples=256, batch_size=8)):
                loss = F.cross_entropy(model(x), y)
                run.backward(loss)
                opt.step()
                opt.zero_grad()
                if run.state.step == 14:  # poisoned between two saves, nobody watching
                    with torch.no_grad():
                        model[0].weight[0, 0] = float("nan")
                run.step(loss=loss)
    store = Store(f"sqlite:///{home / 'prudent.db'}")
    events = [e for e in store.events(run.id) if e["kind"] == "checkpoint"]
    store.close()
    refused = [e for e in events if e["name"] == "not_finite"]
    assert [e["step"] for e in refused] == [20, 30]
    assert "0.weight holds NaN or infinite values" in refused[0]["message"]
    kept = sorted(p.name for p in (home / "runs" / run.id / "checkpoints").glob("ckpt-*"))
    # the newest good one survived keep=1, with its model's shards; a refused save wrote none
    assert kept == ["ckpt-0000000010", "ckpt-0000000010.shards"]
