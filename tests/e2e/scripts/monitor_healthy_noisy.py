"""Healthy but noisy: batches of 4 and 20% wrong labels make every step's loss jump around."""

import torch
from _monitor_task import blobs, loaders, mlp, train

import prudent

run = prudent.init(name="monitor-healthy-noisy", config={"lr": 0.005, "noise": 0.2, "epochs": 2})
x, y = blobs()
flip = torch.rand(len(y), generator=torch.Generator().manual_seed(2)) < run.config["noise"]
y = torch.where(flip, torch.randint(0, 10, y.shape, generator=torch.Generator().manual_seed(3)), y)
train_loader, val_loader = loaders(x, y, batch_size=4)
model = mlp()
opt = torch.optim.SGD(model.parameters(), lr=run.config["lr"], momentum=0.9)
train(run, model, opt, train_loader, run.config["epochs"], val_loader=val_loader)
