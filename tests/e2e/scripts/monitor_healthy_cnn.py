"""Healthy CNN: conv (with a bias before BatchNorm, whose gradient is zero), ReLU, pooling,
SGD with Nesterov momentum and a step decay, on 8x8 images made from generated data."""

import torch
from _monitor_task import blobs, loaders, train
from torch import nn

import prudent

run = prudent.init(name="monitor-healthy-cnn", config={"lr": 0.01, "epochs": 8})
x, y = blobs(n=3072, features=64, spread=0.4)
train_loader, val_loader = loaders(x.view(-1, 1, 8, 8), y)
torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                      nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
                      nn.MaxPool2d(2), nn.Flatten(), nn.Linear(32 * 16, 10))
opt = torch.optim.SGD(model.parameters(), lr=run.config["lr"], momentum=0.9, nesterov=True)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.3)
train(run, model, opt, train_loader, run.config["epochs"], val_loader=val_loader, sched=sched)
