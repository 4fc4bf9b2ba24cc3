"""Repairable: in epoch 3 a shard of 30 batches has corrupted labels, which pushes the loss
far up for as long as it lasts and damages the weights ->
loss_spike rolls back to the checkpoint before it and skips the rest of the shard."""

import torch
from _monitor_task import ShardedLoader, blobs, loaders, mlp, train

import prudent

run = prudent.init(name="monitor-spike-rollback", config={"lr": 3e-3, "epochs": 8})
x, y = blobs(n=3584 + 512)
train_loader, val_loader = loaders(x, y)
BAD = range(40, 70)


def spoil(batch):
    x, y = batch
    return x, (y + 3) % 10


loader = ShardedLoader(train_loader, bad_epoch=2, bad=BAD, spoil=spoil)
model = mlp()
opt = torch.optim.Adam(model.parameters(), lr=run.config["lr"])
sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, run.config["epochs"] * len(loader))
train(run, model, opt, loader, run.config["epochs"], val_loader=val_loader, sched=sched,
      sched_per_step=True, onset=2 * len(loader) + BAD.start + 1)
