"""Sick: twelve sigmoid layers; the first ones get no gradient at all -> vanishing_gradient."""

import torch
from _monitor_task import blobs, loaders, mlp, train
from torch import nn

import prudent

run = prudent.init(name="monitor-deep-sigmoid", config={"lr": 0.1, "depth": 12, "epochs": 3})
x, y = blobs()
train_loader, val_loader = loaders(x, y)
model = mlp(depth=run.config["depth"], act=nn.Sigmoid)
opt = torch.optim.SGD(model.parameters(), lr=run.config["lr"], momentum=0.9)
train(run, model, opt, train_loader, run.config["epochs"], val_loader=val_loader)
