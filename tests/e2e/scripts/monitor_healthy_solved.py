"""Healthy: a task the model solves outright (well-separated clusters): the loss falls to
~0 and so do the gradients. That is convergence, not a vanishing gradient (a tiny BERT that
solved its task was stopped by vanishing_gradient before its `converged` guard)."""

import torch
from _monitor_task import blobs, loaders, train
from torch import nn

import prudent

run = prudent.init(name="monitor-healthy-solved", config={"lr": 3e-3, "epochs": 10})
x, y = blobs(n=8192, spread=8.0)
train_loader, val_loader = loaders(x, y)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 128), nn.Tanh(), nn.Linear(128, 128), nn.Tanh(),
                      nn.Linear(128, 10))
opt = torch.optim.Adam(model.parameters(), lr=run.config["lr"])
train(run, model, opt, train_loader, run.config["epochs"], val_loader=val_loader)
