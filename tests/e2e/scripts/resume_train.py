"""A real model with every known resume trap: a shuffled DataLoader with 2 workers, dropout,
an LR scheduler stepped every batch, AdamW. Each step appends "<pid> <step>" to the log file
before run.step (so a step is logged once its update happened); at the end the model and
optimizer states are written to `out`. Deterministic on CPU with one thread.
"""

import os
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import prudent

torch.set_num_threads(1)
run = prudent.init(name="resume", config={"epochs": 3, "out": "final.pt", "log": "steps.log",
                                          "sleep_s": 0.0, "hidden": 64, "workers": 2})
cfg = run.config
out = cfg["out"]  # read with the others, not only once training is over
torch.manual_seed(0)
features = torch.randn(384, 16)
labels = (features[:, :3].sum(1) > 0).long()
loader = DataLoader(TensorDataset(features, labels), batch_size=16, shuffle=True,
                    num_workers=cfg["workers"], persistent_workers=False)
model = nn.Sequential(nn.Linear(16, cfg["hidden"]), nn.ReLU(), nn.Dropout(0.3),
                      nn.Linear(cfg["hidden"], cfg["hidden"]), nn.ReLU(), nn.Dropout(0.3),
                      nn.Linear(cfg["hidden"], 2))
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=7, gamma=0.9)
run.attach(model=model, optimizer=opt, scheduler=sched)
with run, open(cfg["log"], "a") as log:
    for epoch in run.epochs(cfg["epochs"]):
        for x, y in run.batches(loader):
            loss = F.cross_entropy(model(x), y)
            run.backward(loss)
            opt.step()
            opt.zero_grad()
            sched.step()
            log.write(f"{os.getpid()} {run.state.step + 1}\n")
            log.flush()
            run.step(loss=loss)
            time.sleep(cfg["sleep_s"])
torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
            "scheduler": sched.state_dict()}, out)
