"""Healthy: SGD with cosine annealing and warm restarts every 150 steps (the learning rate
falls to ~0 at the end of each cycle, then jumps back up)."""

import torch
from _monitor_task import blobs, loaders, mlp, train

import prudent

run = prudent.init(name="monitor-healthy-restarts", config={"lr": 0.05, "epochs": 4})
x, y = blobs(n=8192)
train_loader, val_loader = loaders(x, y)
model = mlp(hidden=32)
opt = torch.optim.SGD(model.parameters(), lr=run.config["lr"], momentum=0.9)
sched = torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(opt, T_0=150, eta_min=0.0)
train(run, model, opt, train_loader, run.config["epochs"], val_loader=val_loader, sched=sched,
      sched_per_step=True)
