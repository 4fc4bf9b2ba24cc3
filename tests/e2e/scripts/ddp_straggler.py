"""DDP on CPU (gloo), two ranks. Every rank "computes" `base_ms` per step (a sleep standing in
for a forward pass heavy enough that rank 0's extra per-step work, the record, is a small
share of it), and rank 1 sleeps `slow_ms` more before its forward: with `slow_ms` > 0 it is a
straggler the other rank waits for in DDP's gradient all-reduce. Rank 0 prints how many times
the ranks compared their timings."""

import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import prudent
from prudent.profile import StragglerWatch

torch.set_num_threads(1)
dist.init_process_group("gloo")
run = prudent.init(name="straggler", config={"steps": 200, "base_ms": 5, "slow_ms": 0})
cfg = run.config
rank = dist.get_rank()
torch.manual_seed(0)
features = torch.randn(16 * cfg["steps"], 8)
dataset = TensorDataset(features, (features[:, 0] > 0).long())
loader = DataLoader(dataset, batch_size=8, sampler=DistributedSampler(dataset, seed=3))
model = DistributedDataParallel(nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2)))
opt = torch.optim.SGD(model.parameters(), lr=1e-2)
run.attach(model=model, optimizer=opt)
pause_s = (cfg["base_ms"] + (cfg["slow_ms"] if rank == 1 else 0)) / 1000
with run:
    for epoch in run.epochs(1):
        for x, y in run.batches(loader):
            time.sleep(pause_s)
            loss = F.cross_entropy(model(x), y)
            run.backward(loss)
            opt.step()
            opt.zero_grad()
            run.step(loss=loss)
watch = next(c for c in run.context.components if isinstance(c, StragglerWatch))
if rank == 0:
    print(f"COMPARISONS {watch.num_comparisons}", flush=True)
dist.destroy_process_group()
