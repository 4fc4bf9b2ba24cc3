"""Sick: a schedule bug (a decay meant for 3000 steps written for 300) zeroes the learning rate
at step 300 of 2,016; the run goes on without learning -> update_ratio."""

import torch
from _monitor_task import blobs, loaders, mlp, train

import prudent

run = prudent.init(name="monitor-lr-zero", config={"lr": 0.05, "epochs": 18, "decay_steps": 300})
x, y = blobs(n=3584 + 512)
train_loader, val_loader = loaders(x, y)
model = mlp()
opt = torch.optim.SGD(model.parameters(), lr=run.config["lr"], momentum=0.9)
decay = run.config["decay_steps"]
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: max(0.0, 1 - step / decay))
train(run, model, opt, train_loader, run.config["epochs"], val_loader=val_loader, sched=sched,
      sched_per_step=True, onset=decay)
