"""Sick: one batch of bad data (a NaN feature) at a random step poisons the weights -> non_finite."""

import random

import torch
from _monitor_task import blobs, loaders, mlp, train

import prudent

run = prudent.init(name="monitor-nan-batch", config={"lr": 3e-3, "epochs": 3, "seed": 0})
onset = random.Random(run.config["seed"]).randint(100, 200)
x, y = blobs()
train_loader, val_loader = loaders(x, y)
model = mlp()
opt = torch.optim.Adam(model.parameters(), lr=run.config["lr"])


def corrupt(step, batch):
    x, y = batch
    if step == onset:
        x = x.clone()
        x[0, 0] = float("nan")  # a sensor dropout, a division by zero in preprocessing
    return x, y


train(run, model, opt, train_loader, run.config["epochs"], val_loader=val_loader,
      before_step=corrupt, onset=onset)
