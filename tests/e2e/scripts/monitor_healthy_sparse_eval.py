"""Healthy: evaluation only every third epoch, the rest of the time the rules have only the
training loss."""

import torch
from _monitor_task import blobs, loaders, mlp, train

import prudent

run = prudent.init(name="monitor-healthy-sparse-eval", config={"lr": 1e-3, "epochs": 12})
x, y = blobs(n=8192 + 512)
train_loader, val_loader = loaders(x, y)
model = mlp(hidden=32)
opt = torch.optim.Adam(model.parameters(), lr=run.config["lr"])
train(run, model, opt, train_loader, run.config["epochs"], val_loader=val_loader, eval_every=3)
