"""A small real model on generated data that sleeps each step, so wall time (and money at a
fake-expensive price) passes at a known pace. Prints DONE <steps> when training completes."""

import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import prudent

torch.set_num_threads(1)
run = prudent.init(name="cost", config={"epochs": 3, "batches": 40, "sleep_s": 0.02})
cfg = run.config
torch.manual_seed(0)
features = torch.randn(cfg["batches"] * 8, 8)
labels = (features[:, 0] > 0).long()
batches = DataLoader(TensorDataset(features, labels), batch_size=8)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
run.attach(model=model, optimizer=opt)
with run:
    for _epoch in run.epochs(cfg["epochs"]):
        for x, y in run.batches(batches):
            loss = F.cross_entropy(model(x), y)
            run.backward(loss)
            opt.step()
            opt.zero_grad()
            run.step(loss=loss)
            time.sleep(cfg["sleep_s"])
print(f"DONE {run.state.step}", flush=True)
