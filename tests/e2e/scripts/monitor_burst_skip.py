"""Repairable: three batches in a row arrive with their inputs 50x too large (a bad shard of
the data); each of their updates would wreck the weights -> loss_spike skips them, and the
gradient norms of those skipped steps are not taken for an explosion."""

import os

import torch
from _monitor_task import HEALTHY, blobs, loaders, mlp, train

import prudent

run = prudent.init(name="monitor-burst-skip", config={"lr": 0.05, "epochs": 6})
x, y = blobs(n=3584 + 512)
train_loader, val_loader = loaders(x, y)
# benchmarks/monitor.py plays the burst's length, scale and onset (of 672 steps) through these
ONSET = int(os.environ.get("MONITOR_ONSET", "300"))
BURST = int(os.environ.get("MONITOR_BURST", "3"))
SCALE = float(os.environ.get("MONITOR_SCALE", "50"))


class Drawn:
    """The loader, each batch numbered as it is drawn over the run: its place in the data.
    The bad shard is batches ONSET.. of the data, whatever steps they land on: batches a
    rollback skips are drawn too, and never reach a step."""

    def __init__(self, loader):
        self.loader, self.drawn = loader, 0

    def __len__(self):
        return len(self.loader)

    def __iter__(self):
        for x, y in self.loader:
            self.drawn += 1
            yield x, y, self.drawn


def spoil(step, batch):
    x, y, drawn = batch
    return (x * SCALE, y) if ONSET <= drawn < ONSET + BURST and not HEALTHY else (x, y)


model = mlp()
opt = torch.optim.SGD(model.parameters(), lr=run.config["lr"], momentum=0.9)
sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, run.config["epochs"] * len(train_loader))
train(run, model, opt, Drawn(train_loader), run.config["epochs"], val_loader=val_loader, sched=sched,
      sched_per_step=True, before_step=spoil, onset=ONSET)
