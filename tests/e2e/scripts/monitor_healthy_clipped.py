"""Healthy: a large learning rate kept in check by gradient clipping (clip_grad_norm_ at 0.5),
so the raw gradient norm stays high and the loss bumpy."""

import torch
from _monitor_task import blobs, loaders, mlp, train

import prudent

run = prudent.init(name="monitor-healthy-clipped", config={"lr": 0.1, "clip": 0.5, "epochs": 3})
x, y = blobs(n=16384)
train_loader, val_loader = loaders(x, y)
model = mlp()
opt = torch.optim.SGD(model.parameters(), lr=run.config["lr"], momentum=0.9)
train(run, model, opt, train_loader, run.config["epochs"], val_loader=val_loader,
      clip=run.config["clip"])
