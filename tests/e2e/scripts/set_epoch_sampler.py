"""A per-epoch sampler the script moves itself, as torchvision's reference script does under
torchrun: a ``DistributedSampler`` (here one replica, no process group) and
``sampler.set_epoch(epoch)`` at the top of each epoch, before ``run.batches``; dropout and AdamW.
``term_at``: the process sends itself SIGTERM once, after that step. The final model is
written to ``out``.
"""

import os
import signal

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import prudent

torch.set_num_threads(1)
run = prudent.init(name="set-epoch", config={"epochs": 3, "term_at": 0, "out": "final.pt"})
cfg = run.config
term_at, out = cfg["term_at"], cfg["out"]
torch.manual_seed(0)
features = torch.randn(96, 12)
labels = (features[:, :2].sum(1) > 0).long()
dataset = TensorDataset(features, labels)
sampler = DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True, seed=7)
loader = DataLoader(dataset, batch_size=8, sampler=sampler)
model = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 2))
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
run.attach(model=model, optimizer=opt)
with run:
    for epoch in run.epochs(cfg["epochs"]):
        sampler.set_epoch(epoch)
        for x, y in run.batches(loader):
            loss = F.cross_entropy(model(x), y)
            run.backward(loss)
            opt.step()
            opt.zero_grad()
            run.step(loss=loss)
            if run.state.step == term_at and not os.path.exists("termed"):
                open("termed", "w").close()
                os.kill(os.getpid(), signal.SIGTERM)
torch.save(model.state_dict(), out)
