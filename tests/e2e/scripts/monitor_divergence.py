"""Sick: after step 200 a warm restart keeps raising Adam's learning rate -> divergence."""

import torch
from _monitor_task import blobs, loaders, mlp, train

import prudent

run = prudent.init(name="monitor-divergence", config={"lr": 3e-3, "growth": 1.03, "onset": 200,
                                                       "epochs": 4})
cfg = run.config
x, y = blobs()
train_loader, val_loader = loaders(x, y)
model = mlp()
opt = torch.optim.Adam(model.parameters(), lr=cfg["lr"])
sched = torch.optim.lr_scheduler.LambdaLR(
    opt, lambda step: cfg["growth"] ** max(0, step - cfg["onset"]))
train(run, model, opt, train_loader, cfg["epochs"], val_loader=val_loader, sched=sched,
      sched_per_step=True, onset=cfg["onset"])
