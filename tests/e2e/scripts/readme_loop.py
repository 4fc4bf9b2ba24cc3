"""The README's loop as users write it: epochs of batches, then the epoch's end (the
scheduler stepped per epoch, an evaluation, run.log). Early stopping keeps a checkpoint of
each new best from inside that run.log, after the scheduler's step."""

import time

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import prudent

torch.manual_seed(0)
features, labels = load_digits(return_X_y=True)
x = torch.tensor(features, dtype=torch.float32) / 16.0
y = torch.tensor(labels, dtype=torch.long)
train_loader = DataLoader(TensorDataset(x[:1400], y[:1400]), batch_size=32, shuffle=True)

run = prudent.init(name="readme-loop", config={"lr": 1e-3, "epochs": 6, "sleep_s": 0.0,
                                               "out": "final.pt"})
cfg = run.config
model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"])
sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=cfg["epochs"])
run.attach(model=model, optimizer=opt, scheduler=sched)
with run:
    for epoch in run.epochs(cfg["epochs"]):
        for xb, yb in run.batches(train_loader):
            loss = F.cross_entropy(model(xb), yb)
            run.backward(loss)
            opt.step()
            opt.zero_grad()
            run.step(loss=loss)
            time.sleep(cfg["sleep_s"])
        sched.step()
        with torch.no_grad():
            run.log(val_acc=(model(x[1400:]).argmax(1) == y[1400:]).float().mean().item())
torch.save({"model": model.state_dict(), "sched": sched.state_dict()}, cfg["out"])
