"""A tiny real training script for `prudent tune`: an MLP on generated data, a few epochs.

The tuner changes `lr`, `hidden`, `optimizer`, `momentum` through run.config; the objective is
`val_acc`, logged once per epoch. SGD with a huge learning rate diverges to NaN (a sick trial
for the rules); a tiny one barely learns (a weak trial for the pruner). `epoch_sleep_s` slows
each epoch down so that a test can interrupt a study mid-trial.
"""

import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import prudent

torch.set_num_threads(1)
run = prudent.init(name="tune-train", config={"lr": 0.05, "hidden": 16, "optimizer": "adam",
                                              "momentum": 0.0, "epochs": 4, "epoch_sleep_s": 0.0,
                                              "metric": "val_acc"})
cfg = run.config
generator = torch.Generator().manual_seed(0)
x = torch.randn(640, 10, generator=generator)
y = ((x[:, 0] * x[:, 1] + x[:, 2:5].sum(1)) > 0).long()
train = DataLoader(TensorDataset(x[:512], y[:512]), batch_size=32, shuffle=True,
                   generator=torch.Generator().manual_seed(1))
x_val, y_val = x[512:], y[512:]
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(10, cfg["hidden"]), nn.ReLU(), nn.Linear(cfg["hidden"], 2))
if cfg["optimizer"] == "sgd":
    opt = torch.optim.SGD(model.parameters(), lr=cfg["lr"], momentum=cfg["momentum"])
else:
    opt = torch.optim.Adam(model.parameters(), lr=cfg["lr"])
run.attach(model=model, optimizer=opt)
with run:
    for epoch in run.epochs(cfg["epochs"]):
        for xb, yb in run.batches(train):
            loss = F.cross_entropy(model(xb), yb)
            run.backward(loss)
            opt.step()
            opt.zero_grad()
            run.step(loss=loss)
        time.sleep(cfg["epoch_sleep_s"])
        with torch.no_grad():
            acc = (model(x_val).argmax(1) == y_val).float().mean().item()
        run.log(**{cfg["metric"]: acc})
