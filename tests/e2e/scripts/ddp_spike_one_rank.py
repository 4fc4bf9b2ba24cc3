"""DDP on 2 ranks where only rank 1 draws a bad batch (inputs x50) at steps 251-253: its loss
is an outlier, rank 0's is not. Writes the largest difference between the two ranks' final
weights to replicas.txt (0.0: the replicas stayed one model)."""

import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

import prudent

dist.init_process_group("gloo")
run = prudent.init(name="ddp-spike")
rank = int(os.environ["RANK"])
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
ddp = torch.nn.parallel.DistributedDataParallel(model)
opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
run.attach(model=ddp, optimizer=opt)
draws = torch.Generator().manual_seed(100 + rank)  # each rank its own data
teacher = torch.randn(16, 4, generator=torch.Generator().manual_seed(7))
with run:
    for step in run.steps(int(os.environ.get("STEPS", "400"))):
        x = torch.randn(32, 16, generator=draws)
        y = (x @ teacher).argmax(1)
        if rank == 1 and 250 <= step < 253:
            x = x * 50
        loss = F.cross_entropy(ddp(x), y)
        run.backward(loss)
        opt.step()
        opt.zero_grad()
        run.step(loss=loss)
flat = torch.cat([p.detach().flatten() for p in model.parameters()])
both = [torch.zeros_like(flat) for _ in range(2)]
dist.all_gather(both, flat)
if rank == 0:
    Path("replicas.txt").write_text(f"{(both[0] - both[1]).abs().max().item()}\n")
dist.destroy_process_group()
