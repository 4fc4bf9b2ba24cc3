"""Lightning Fabric needs no adapter: Fabric calls only what the loop calls, so prudent's own
five lines go inside a Fabric loop as they go inside a plain one, and a stopped run resumes
to the same weights."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

import prudent
from prudent.testing import StopAtStep, make_settings, tiny_loader, tiny_model

fabric_module = pytest.importorskip("lightning.fabric")


def _train(home: Path, monkeypatch: pytest.MonkeyPatch, run_id: str,
           stop_at: int | None = None) -> tuple[dict[str, torch.Tensor], str | None]:
    monkeypatch.setenv("PRUDENT_RUN_ID", run_id)
    fabric = fabric_module.Fabric(accelerator="cpu", devices=1)
    run = prudent.init(name="fabric", config={"lr": 0.1, "epochs": 3}, exit_on_stop=False,
                       settings=make_settings(home, checkpoint={"every": "3steps"},
                                              console={"mode": "off"}))
    if stop_at is not None:
        run.context.add_component(StopAtStep(stop_at))
    model = tiny_model()
    model, opt = fabric.setup(model, torch.optim.SGD(model.parameters(), lr=run.config["lr"]))
    run.attach(model=model, optimizer=opt)
    data = tiny_loader(num_samples=64, batch_size=8).dataset
    loader = DataLoader(data, batch_size=8, shuffle=True)  # the order drawn from torch's RNG
    with run:
        for epoch in run.epochs(run.config["epochs"]):
            for x, y in run.batches(loader):
                x, y = fabric.to_device((x, y))
                loss = F.cross_entropy(model(x), y)
                run.backward(loss)  # on one device fabric.backward(loss) is loss.backward()
                opt.step()
                opt.zero_grad()
                run.step(loss=loss)
            run.log(train_loss=loss.detach())
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, run.stop_reason


def test_prudent_in_a_fabric_loop_stops_and_resumes_to_the_same_weights(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reference, reason = _train(tmp_path, monkeypatch, "reference")
    assert reason is None
    _, stopped = _train(tmp_path, monkeypatch, "victim", stop_at=13)  # mid-epoch 2
    assert stopped == "preempted"
    resumed, reason = _train(tmp_path, monkeypatch, "victim")
    assert reason is None
    for key in reference:
        assert torch.equal(reference[key], resumed[key]), key
