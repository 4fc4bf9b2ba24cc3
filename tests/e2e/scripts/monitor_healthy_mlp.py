"""Healthy: an MLP with dropout, AdamW and a cosine schedule, evaluated every epoch."""

import torch
from _monitor_task import blobs, loaders, train
from torch import nn

import prudent

run = prudent.init(name="monitor-healthy-mlp", config={"lr": 3e-3, "epochs": 6})
x, y = blobs(n=8192)
train_loader, val_loader = loaders(x, y)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Dropout(0.1), nn.Linear(128, 128),
                      nn.ReLU(), nn.Dropout(0.1), nn.Linear(128, 10))
opt = torch.optim.AdamW(model.parameters(), lr=run.config["lr"])
sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=run.config["epochs"])
train(run, model, opt, train_loader, run.config["epochs"], val_loader=val_loader, sched=sched)
