"""resume_train.py's model, logging 256 metrics a step besides the loss, so the store's
writer thread is often inside a large commit: a test kills the process there. Each step
appends "<pid> <step>" to steps.log before run.step; at the end the model's state is written
to final.pt. Deterministic on CPU with one thread.
"""

import os
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import prudent

torch.set_num_threads(1)
run = prudent.init(name="commit", config={"epochs": 3, "sleep_s": 0.02})
cfg = run.config
torch.manual_seed(0)
features = torch.randn(384, 16)
labels = (features[:, :3].sum(1) > 0).long()
loader = DataLoader(TensorDataset(features, labels), batch_size=16, shuffle=True)
model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Dropout(0.3), nn.Linear(64, 2))
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
probes = {f"probe_{i:03d}": float(i) for i in range(256)}
run.attach(model=model, optimizer=opt)
with run, open("steps.log", "a") as log:
    for epoch in run.epochs(cfg["epochs"]):
        for x, y in run.batches(loader):
            loss = F.cross_entropy(model(x), y)
            run.backward(loss)
            opt.step()
            opt.zero_grad()
            log.write(f"{os.getpid()} {run.state.step + 1}\n")
            log.flush()
            run.step(loss=loss, **probes)
            time.sleep(cfg["sleep_s"])
torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, "final.pt")
