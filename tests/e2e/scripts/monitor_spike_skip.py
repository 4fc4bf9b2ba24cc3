"""Repairable: one batch arrives with its inputs 1000x too large (a unit bug in one file); its
update alone wrecks the weights -> loss_spike skips that update."""

import torch
from _monitor_task import HEALTHY, blobs, loaders, mlp, train

import prudent

run = prudent.init(name="monitor-spike-skip", config={"lr": 0.05, "epochs": 6})
x, y = blobs(n=3584 + 512)
train_loader, val_loader = loaders(x, y)
ONSET = 300


def spoil(step, batch):
    x, y = batch
    return (x * 1000, y) if step == ONSET and not HEALTHY else (x, y)


model = mlp()
opt = torch.optim.SGD(model.parameters(), lr=run.config["lr"], momentum=0.9)
sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, run.config["epochs"] * len(train_loader))
train(run, model, opt, train_loader, run.config["epochs"], val_loader=val_loader, sched=sched,
      sched_per_step=True, before_step=spoil, onset=ONSET)
