"""Sick: a short run (448 steps) whose loop keeps 1 MiB per step alive -> memory_growth."""

import torch
from _monitor_task import blobs, loaders, mlp, train

import prudent

run = prudent.init(name="monitor-leak-short", config={"lr": 3e-3, "kb_per_step": 1024,
                                                       "epochs": 4})
x, y = blobs(n=3584 + 512)
train_loader, _ = loaders(x, y)
model = mlp()
opt = torch.optim.Adam(model.parameters(), lr=run.config["lr"])
kept = []


def keep(step, loss):
    kept.append(torch.ones(run.config["kb_per_step"] * 256))  # a debug tensor, every step


train(run, model, opt, train_loader, run.config["epochs"], after_step=keep)
