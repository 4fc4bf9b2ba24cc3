"""DDP on CPU (gloo), two ranks: a shuffled DistributedSampler, dropout, AdamW. With
`stop_rank1_at` set, rank 1 alone asks to stop at that step; every rank logs the steps it
completed, and rank 0 saves the final weights to `out`."""

import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import prudent

torch.set_num_threads(1)
dist.init_process_group("gloo")
run = prudent.init(name="ddp", config={"epochs": 2, "stop_rank1_at": 0, "out": "final.pt"})
cfg = run.config
out = cfg["out"]  # read with the others, not only once training is over
rank = dist.get_rank()
torch.manual_seed(0)
features = torch.randn(256, 8)
labels = (features[:, 0] > 0).long()
dataset = TensorDataset(features, labels)
loader = DataLoader(dataset, batch_size=8, sampler=DistributedSampler(dataset, shuffle=True, seed=3))
model = DistributedDataParallel(nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.2),
                                              nn.Linear(32, 2)))
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
run.attach(model=model, optimizer=opt)
with run, open(f"rank{rank}.log", "a") as log:
    for epoch in run.epochs(cfg["epochs"]):
        for x, y in run.batches(loader):
            loss = F.cross_entropy(model(x), y)
            run.backward(loss)
            opt.step()
            opt.zero_grad()
            if rank == 1 and run.state.step + 1 == cfg["stop_rank1_at"]:
                run.context.request_stop("preempted", "rank 1 was told its machine goes away")
            log.write(f"{os.getpid()} {run.state.step + 1}\n")
            log.flush()
            run.step(loss=loss)
if rank == 0:
    torch.save({"model": model.module.state_dict(), "optimizer": opt.state_dict()}, out)
dist.destroy_process_group()
