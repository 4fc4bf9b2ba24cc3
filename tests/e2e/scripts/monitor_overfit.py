"""Sick: a large network on 64 training examples; validation worsens while training improves
-> overfitting."""

import torch
from _monitor_task import blobs, loaders, mlp, train

import prudent

run = prudent.init(name="monitor-overfit", config={"lr": 1e-3, "train_examples": 64,
                                                    "epochs": 300})
x, y = blobs(n=512 + run.config["train_examples"], spread=0.6)
train_loader, val_loader = loaders(x, y)
model = mlp(hidden=256)
opt = torch.optim.Adam(model.parameters(), lr=run.config["lr"])
train(run, model, opt, train_loader, run.config["epochs"], val_loader=val_loader, onset=None)
