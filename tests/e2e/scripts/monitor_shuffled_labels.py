"""Sick: the features and the labels are shuffled separately (two loaders, two orders), so
labels carry no information about their inputs; nothing can be learned -> loss_not_decreasing."""

import torch
from _monitor_task import blobs, loaders, mlp, train

import prudent

run = prudent.init(name="monitor-shuffled", config={"lr": 0.01, "epochs": 25})
x, y = blobs(n=8192)
train_loader, _ = loaders(x, y, batch_size=64)
model = mlp(hidden=32, depth=1)
opt = torch.optim.SGD(model.parameters(), lr=run.config["lr"], momentum=0.9)
generator = torch.Generator().manual_seed(1)


def mismatch(step, batch):
    x, y = batch
    return x, y[torch.randperm(len(y), generator=generator)]


train(run, model, opt, train_loader, run.config["epochs"], before_step=mismatch)
