"""Sick: the data source hangs at batch 60 (a dead network mount, a deadlocked worker) ->
stalled."""

import time

import torch
from _monitor_task import announce, blobs, loaders, mlp

import prudent

run = prudent.init(name="monitor-hang", config={"lr": 3e-3, "hang_at": 60, "epochs": 2})
x, y = blobs()
train_loader, _ = loaders(x, y)
model = mlp()
opt = torch.optim.Adam(model.parameters(), lr=run.config["lr"])


def batches():
    for epoch in range(run.config["epochs"]):
        for i, batch in enumerate(train_loader):
            if epoch * len(train_loader) + i + 1 == run.config["hang_at"]:
                print("HANGING", flush=True)
                time.sleep(3600)
            yield batch


announce(run.config["epochs"] * len(train_loader), run.config["hang_at"] - 1)
run.attach(model=model, optimizer=opt)
with run:
    for x, y in run.batches(batches()):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        run.backward(loss)
        opt.step()
        opt.zero_grad()
        run.step(loss=loss)
print("COMPLETED")
