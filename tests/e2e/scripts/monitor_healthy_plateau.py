"""Healthy: a long plateau that later drops. A narrow three-layer tanh net starts with small
weights (near a saddle): the loss sits at ln(10) for a few hundred steps, then falls."""

import torch
from _monitor_task import blobs, loaders, mlp, train
from torch import nn

import prudent

run = prudent.init(name="monitor-healthy-plateau", config={"lr": 0.1, "init": 0.4,
                                                            "epochs": 12})
x, y = blobs(n=3584 + 512)
train_loader, val_loader = loaders(x, y)
model = mlp(hidden=32, depth=3, act=nn.Tanh)
with torch.no_grad():
    for p in model.parameters():
        p.mul_(run.config["init"])
opt = torch.optim.SGD(model.parameters(), lr=run.config["lr"])
train(run, model, opt, train_loader, run.config["epochs"], val_loader=val_loader)
