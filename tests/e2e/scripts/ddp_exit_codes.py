"""DDP on CPU (gloo), two ranks, for the exit code `prudent run -- torchrun` reports. Every
rank appends each step it completed to `rank<r>.log` (a test waits for it before signalling);
with `nan_rank1_at` set, rank 1's loss alone is NaN at that step; with `crash_rank1_at` set,
rank 1's script raises at that step (a bug on one rank); `step_s` slows each step so that a
signal lands while the ranks train."""

import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import prudent

torch.set_num_threads(1)
dist.init_process_group("gloo")
run = prudent.init(name="ddp-exit-codes", config={"nan_rank1_at": 0, "crash_rank1_at": 0,
                                                      "step_s": 0.0})
cfg = run.config
rank = dist.get_rank()
torch.manual_seed(0)
features = torch.randn(1200, 4)
dataset = TensorDataset(features, (features[:, 0] > 0).long())
loader = DataLoader(dataset, batch_size=4, sampler=DistributedSampler(dataset, seed=3))
model = DistributedDataParallel(nn.Linear(4, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
run.attach(model=model, optimizer=opt)
with run, open(f"rank{rank}.log", "a") as log:
    for epoch in run.epochs(1):
        for x, y in run.batches(loader):
            loss = F.cross_entropy(model(x), y)
            if rank == 1 and run.state.step + 1 == cfg["crash_rank1_at"]:
                raise RuntimeError("boom on rank 1")
            if rank == 1 and run.state.step + 1 == cfg["nan_rank1_at"]:
                loss = loss * float("nan")
            run.backward(loss)
            opt.step()
            opt.zero_grad()
            log.write(f"{run.state.step + 1}\n")
            log.flush()
            run.step(loss=loss)
            time.sleep(cfg["step_s"])
dist.destroy_process_group()
