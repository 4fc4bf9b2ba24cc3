"""Sick: the loop keeps every loss (with its graph) and a debug tensor alive -> memory_growth."""

import torch
from _monitor_task import blobs, loaders, mlp, train

import prudent

run = prudent.init(name="monitor-leak", config={"lr": 3e-3, "kb_per_step": 128, "epochs": 12})
x, y = blobs()
train_loader, _ = loaders(x, y)
model = mlp()
opt = torch.optim.Adam(model.parameters(), lr=run.config["lr"])
kept = []


def keep(step, loss):
    kept.append((loss, torch.ones(run.config["kb_per_step"] * 256)))  # loss with its graph


train(run, model, opt, train_loader, run.config["epochs"], after_step=keep)
