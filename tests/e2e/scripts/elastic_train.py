"""An elastic DDP job: an epoch loop over a DistributedSampler of 1,024 generated samples that
carry their index, under `torchrun --nnodes MIN:MAX`. Every rank appends
`start_step step world rank epoch index...` for each batch it trained to `samples.log` in the
shared folder `LOG_DIR` (`start_step`: the step this worker resumed at, the same on every rank
of one world); rank 0 writes the validation loss on 512 held-out samples to `val.json` at the
end. The learning rate scales with the world (`lr` is 2 ranks'), as elastic jobs do, so an
epoch on fewer ranks makes as much progress. `step_sleep_s` slows each step down so a test
can kill a node mid-run."""

import json
import os
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
run = prudent.init(name="elastic", config={"epochs": 3, "step_sleep_s": 0.0, "lr": 0.05})
cfg = run.config
rank, world = dist.get_rank(), dist.get_world_size()
generator = torch.Generator().manual_seed(0)
features = torch.randn(1536, 16, generator=generator)
labels = (features[:, :4].sum(dim=1) > 0).long()
flipped = torch.rand(1536, generator=generator) < 0.1  # label noise: the loss has a floor
labels = torch.where(flipped, 1 - labels, labels)
dataset = TensorDataset(torch.arange(1024), features[:1024], labels[:1024])
loader = DataLoader(dataset, batch_size=8, sampler=DistributedSampler(dataset, seed=5))
torch.manual_seed(1)
model = DistributedDataParallel(nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 2)))
opt = torch.optim.SGD(model.parameters(), lr=cfg["lr"], momentum=0.9)
run.attach(model=model, optimizer=opt)
for group in opt.param_groups:  # after a resume too: linear scaling to this world's batch
    group["lr"] = cfg["lr"] * world / 2
start = run.state.step
log_dir = os.environ.get("LOG_DIR", ".")
with run, open(os.path.join(log_dir, "samples.log"), "a") as log:
    for epoch in run.epochs(cfg["epochs"]):
        for index, x, y in run.batches(loader):
            loss = F.cross_entropy(model(x), y)
            run.backward(loss)
            opt.step()
            opt.zero_grad()
            time.sleep(cfg["step_sleep_s"])
            log.write(f"{start} {run.state.step + 1} {world} {rank} {epoch} "
                      f"{' '.join(map(str, index.tolist()))}\n")
            log.flush()
            run.step(loss=loss)
if rank == 0:
    with torch.no_grad():
        val = F.cross_entropy(model.module(features[1024:]), labels[1024:]).item()
    with open(os.path.join(log_dir, "val.json"), "w") as out:
        json.dump({"val_loss": val, "step": run.state.step, "world": world}, out)
dist.destroy_process_group()
