"""Failure capture on an FSDP2 model: a bundle holds this rank's shards as plain tensors."""

from __future__ import annotations

from pathlib import Path

import torch

import prudent
from prudent.debug.bundle import read_bundle
from prudent.debug.capture import FailureCapture
from prudent.debug.settings import DebugSettings
from prudent.wiring.config import ProjectSettings
from tests.fsdp2 import one_rank_mesh, sharded_mlp


def test_a_sharded_models_non_finite_gradients_are_captured_as_local_shards(
        settings: ProjectSettings, tmp_path: Path) -> None:
    with one_rank_mesh(tmp_path) as mesh:
        _, model = sharded_mlp(mesh)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        run = prudent.init(name="capture", settings=settings, exit_on_stop=False,
                           components=[FailureCapture(DebugSettings(check_gradients=True))])
        run.attach(model=model, optimizer=opt)
        before = {k: v.full_tensor().clone() for k, v in model.state_dict().items()}
        with run:
            for x in run.batches([torch.randn(4, 8)]):
                loss = (model(x) * 0).abs().sqrt().mean()  # 0, and its gradient NaN
                run.backward(loss)
                opt.step()
                run.step(loss=loss)
    (path,) = sorted((run.context.run_dir / "captures").glob("step-*"))
    bundle = read_bundle(path)
    assert bundle.info["local_shards"] is True
    assert bundle.info["message"].startswith("gradients are not finite in 0.weight, 0.bias")
    saved = bundle.load("object-model.pt")  # weights_only: plain tensors, no DTensor
    assert all(type(v) is torch.Tensor and torch.equal(v, before[k]) for k, v in saved.items())
    assert bundle.load("object-optimizer.pt")["param_groups"]
