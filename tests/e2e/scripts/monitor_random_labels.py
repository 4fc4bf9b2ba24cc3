"""Sick: a classifier trained on random labels that logs only val_acc, which stays at chance
(issue 17's example: 20 epochs, 2,260 steps) -> early_stopping."""

import torch
from _monitor_task import SEED, accuracy, blobs, loaders, mlp, train

import prudent

run = prudent.init(name="monitor-random-labels", config={"lr": 3e-3, "epochs": 20})
x, _ = blobs(n=3616 + 512)
y = torch.randint(0, 10, (len(x),), generator=torch.Generator().manual_seed(7 + SEED))
train_loader, val_loader = loaders(x, y)
model = mlp()
opt = torch.optim.Adam(model.parameters(), lr=run.config["lr"])
train(run, model, opt, train_loader, run.config["epochs"], val_loader=val_loader,
      evaluate_fn=accuracy)
