"""DDP on CPU (gloo), two ranks; at step `hang_at` rank 1 sleeps for an hour before its forward
(a dead mount on its machine, a deadlock): rank 0 goes on into backward and waits for it in
the gradient all-reduce."""

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
run = prudent.init(name="hang", config={"hang_at": 20})
rank = dist.get_rank()
torch.manual_seed(0)
features = torch.randn(1024, 8)
dataset = TensorDataset(features, (features[:, 0] > 0).long())
loader = DataLoader(dataset, batch_size=8, sampler=DistributedSampler(dataset, seed=3))
model = DistributedDataParallel(nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2)))
opt = torch.optim.SGD(model.parameters(), lr=1e-2)
run.attach(model=model, optimizer=opt)
with run:
    for epoch in run.epochs(1):
        for x, y in run.batches(loader):
            if rank == 1 and run.state.step + 1 == run.config["hang_at"]:
                print("HANGING", flush=True)
                time.sleep(3600)
            loss = F.cross_entropy(model(x), y)
            run.backward(loss)
            opt.step()
            opt.zero_grad()
            run.step(loss=loss)
dist.destroy_process_group()
