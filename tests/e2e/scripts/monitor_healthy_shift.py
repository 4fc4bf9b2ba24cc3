"""Healthy: the data changes at an epoch boundary. From epoch 3 on the loader reads the next
shard (new examples of the same task, in their own order): the loss steps up at the boundary
(unseen examples), then keeps falling."""

import torch
from _monitor_task import blobs, loaders, mlp, train

import prudent

run = prudent.init(name="monitor-healthy-shift", config={"lr": 1e-3, "epochs": 6})
x, y = blobs(n=2 * 4096 + 512)
first, val_loader = loaders(x[:4096 + 512], y[:4096 + 512])
second, _ = loaders(torch.cat([x[:512], x[4096 + 512:]]), torch.cat([y[:512], y[4096 + 512:]]),
                    seed=1)


class NextShard:
    """Epochs 0-1 read the first shard, the later ones the second (same length)."""

    def __init__(self) -> None:
        self.epoch = -1

    def __len__(self) -> int:
        return len(first)

    def __iter__(self):  # type: ignore[no-untyped-def]
        self.epoch += 1
        return iter(first if self.epoch < 2 else second)


model = mlp()
opt = torch.optim.Adam(model.parameters(), lr=run.config["lr"])
train(run, model, opt, NextShard(), run.config["epochs"], val_loader=val_loader)
