"""Healthy: fine-tuning with tiny updates. A model trained on one dataset (without prudent) is
fine-tuned with Adam at lr 2e-5 on a shifted version of it: small, steady progress."""

import torch
import torch.nn.functional as F
from _monitor_task import blobs, loaders, mlp, train

import prudent

x, y = blobs(n=3584 + 512)
model = mlp(hidden=128)
pretrain = torch.optim.Adam(model.parameters(), lr=3e-3)
for start in range(0, 3000 * 32, 32):  # ~3000 steps of pre-training, a few seconds
    i = start % (len(x) - 32)
    loss = F.cross_entropy(model(x[i:i + 32]), y[i:i + 32])
    pretrain.zero_grad()
    loss.backward()
    pretrain.step()

run = prudent.init(name="monitor-healthy-finetune", config={"lr": 2e-5, "epochs": 6})
shift = torch.randn(x.shape[1], generator=torch.Generator().manual_seed(11)) * 0.3
train_loader, val_loader = loaders(x + shift, y)
opt = torch.optim.Adam(model.parameters(), lr=run.config["lr"])
train(run, model, opt, train_loader, run.config["epochs"], val_loader=val_loader)
