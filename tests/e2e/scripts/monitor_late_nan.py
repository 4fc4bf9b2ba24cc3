"""Sick: a NaN appears only after a long healthy stretch (a bad record in epoch 6 of 10) ->
non_finite, and no checkpoint taken after it may hold the NaN."""

import torch
from _monitor_task import blobs, loaders, mlp, train

import prudent

run = prudent.init(name="monitor-late-nan", config={"lr": 3e-3, "epochs": 10})
x, y = blobs(n=3584 + 512)
train_loader, val_loader = loaders(x, y)
ONSET = 5 * len(train_loader) + 57


def corrupt(step, batch):
    x, y = batch
    if step == ONSET:
        x = x.clone()
        x[3, 5] = float("inf") * 0  # NaN
    return x, y


model = mlp()
opt = torch.optim.Adam(model.parameters(), lr=run.config["lr"])
train(run, model, opt, train_loader, run.config["epochs"], val_loader=val_loader,
      before_step=corrupt, onset=ONSET)
