"""Sick: a schedule typo raises SGD's learning rate 10x at step 200; the gradients blow up over
a few dozen steps before the loss overflows -> exploding_gradient."""

import torch
import torch.nn.functional as F
from _monitor_task import loaders, train, waves
from torch import nn

import prudent

run = prudent.init(name="monitor-high-lr", config={"lr": 0.05, "bad_lr": 0.5, "onset": 200,
                                                    "epochs": 4})
cfg = run.config
x, y = waves()
train_loader, val_loader = loaders(x, y)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))
opt = torch.optim.SGD(model.parameters(), lr=cfg["lr"], momentum=0.9)
sched = torch.optim.lr_scheduler.LambdaLR(
    opt, lambda step: 1.0 if step < cfg["onset"] else cfg["bad_lr"] / cfg["lr"])
train(run, model, opt, train_loader, cfg["epochs"], val_loader=val_loader, sched=sched,
      sched_per_step=True, loss_fn=F.mse_loss, onset=cfg["onset"])
