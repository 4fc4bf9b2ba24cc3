"""Sick: a learning rate typo (1e-6 for SGD); the weights barely move -> update_ratio."""

import torch
from _monitor_task import blobs, loaders, mlp, train

import prudent

run = prudent.init(name="monitor-tiny-lr", config={"lr": 1e-6, "epochs": 4})
x, y = blobs()
train_loader, val_loader = loaders(x, y)
model = mlp()
opt = torch.optim.SGD(model.parameters(), lr=run.config["lr"])
train(run, model, opt, train_loader, run.config["epochs"], val_loader=val_loader)
