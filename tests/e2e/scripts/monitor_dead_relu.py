"""Sick: a first layer initialised with a large negative bias; its ReLUs never fire ->
dead_activations."""

import torch
from _monitor_task import blobs, loaders, mlp, train

import prudent

run = prudent.init(name="monitor-dead-relu", config={"lr": 3e-3, "bias": -8.0, "epochs": 3})
x, y = blobs()
train_loader, val_loader = loaders(x, y)
model = mlp(hidden=128)
torch.nn.init.constant_(model[0].bias, run.config["bias"])
opt = torch.optim.Adam(model.parameters(), lr=run.config["lr"])
train(run, model, opt, train_loader, run.config["epochs"], val_loader=val_loader)
