"""Healthy regression: a tanh network fits a smooth function to a tiny loss, with a cosine
schedule that ends at zero (a flat loss and vanishing updates in the tail are expected)."""

import torch
import torch.nn.functional as F
from _monitor_task import train
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import prudent

run = prudent.init(name="monitor-healthy-regression", config={"lr": 1e-2, "epochs": 25})
generator = torch.Generator().manual_seed(0)
x = torch.rand(2048, 4, generator=generator) * 2 - 1
target = (torch.sin(3 * x[:, :1]) + x[:, 1:2] * x[:, 2:3] - 0.5 * x[:, 3:]).detach()
train_loader = DataLoader(TensorDataset(x[256:], target[256:]), batch_size=32, shuffle=True,
                          generator=torch.Generator().manual_seed(0))
val_loader = DataLoader(TensorDataset(x[:256], target[:256]), batch_size=256)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))
opt = torch.optim.Adam(model.parameters(), lr=run.config["lr"])
sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=run.config["epochs"] * len(train_loader))
train(run, model, opt, train_loader, run.config["epochs"], val_loader=val_loader, sched=sched,
      sched_per_step=True, loss_fn=F.mse_loss)
