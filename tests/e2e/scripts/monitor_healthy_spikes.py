"""Healthy with spikes: a warm-up to a high learning rate then a linear decay, and one batch in
50 with outlier inputs, so the loss and the gradient norm jump for a step and come back."""

import torch
from _monitor_task import blobs, loaders, mlp, train

import prudent

run = prudent.init(name="monitor-healthy-spikes", config={"lr": 0.03, "warmup": 100, "epochs": 6})
cfg = run.config
x, y = blobs(n=8192)
train_loader, val_loader = loaders(x, y)
model = mlp(hidden=128)
opt = torch.optim.SGD(model.parameters(), lr=cfg["lr"], momentum=0.9)
total = cfg["epochs"] * len(train_loader)
sched = torch.optim.lr_scheduler.LambdaLR(
    opt, lambda step: min((step + 1) / cfg["warmup"], max(0.05, 1 - step / total)))


def outliers(step, batch):
    x, y = batch
    return (x * 4, y) if step % 50 == 0 else (x, y)


train(run, model, opt, train_loader, cfg["epochs"], val_loader=val_loader, sched=sched,
      sched_per_step=True, before_step=outliers)
