"""An epoch loop over a DistributedSampler whose samples carry their index, for resuming on
another number of ranks. `stop_rank1_at` makes rank 1 ask to stop at that step; every rank
appends `pid epoch index...` for each batch it trained to `samples.log`."""

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
run = prudent.init(name="world", config={"epochs": 2, "stop_rank1_at": 0})
cfg = run.config
rank = dist.get_rank()
torch.manual_seed(0)
features = torch.randn(256, 8)
dataset = TensorDataset(torch.arange(256), features, (features[:, 0] > 0).long())
loader = DataLoader(dataset, batch_size=4, sampler=DistributedSampler(dataset, shuffle=True, seed=5))
model = DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
run.attach(model=model, optimizer=opt)
with run, open("samples.log", "a") as log:
    for epoch in run.epochs(cfg["epochs"]):
        for index, x, y in run.batches(loader):
            loss = F.cross_entropy(model(x), y)
            run.backward(loss)
            opt.step()
            opt.zero_grad()
            if rank == 1 and run.state.step + 1 == cfg["stop_rank1_at"]:
                run.context.request_stop("preempted", "rank 1 was told its machine goes away")
            log.write(f"{os.getpid()} {epoch} {' '.join(map(str, index.tolist()))}\n")
            log.flush()
            run.step(loss=loss)
dist.destroy_process_group()
