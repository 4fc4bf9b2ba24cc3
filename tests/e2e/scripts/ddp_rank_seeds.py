"""nanoGPT's shape under torchrun: each rank seeds its own stream (`1337 + rank`), draws its
batches with `torch.randint` on the global generator inside `run.steps`, and trains a DDP
model with dropout. `stop_rank1_at` makes rank 1 alone ask to stop (a preemption notice);
`crash_rank1_at` makes rank 1 raise once at that step; `OWN_LOCATION` gives each rank a
checkpoint folder of its own (two nodes that do not share their disks). Every rank logs
`pid step loss` for the steps it completed; rank 0 saves the final weights to `out`."""

import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
if os.environ.get("OWN_LOCATION"):
    os.environ["PRUDENT_CHECKPOINT_URL"] = os.path.abspath(f"node{rank}-checkpoints")

import prudent  # noqa: E402

run = prudent.init(name="seeds", config={"iters": 40, "stop_rank1_at": 0, "crash_rank1_at": 0,
                                         "out": "final.pt"})
cfg = run.config
out = cfg["out"]  # read with the others, not only once training is over
torch.manual_seed(1337 + rank)
data = torch.randn(512, 16)
targets = (data.sum(dim=1) > 0).long()
model = DistributedDataParallel(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.3),
                                              nn.Linear(32, 2)))
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
run.attach(model=model, optimizer=opt)
with run, open(f"rank{rank}.log", "a") as log:
    for it in run.steps(cfg["iters"]):
        index = torch.randint(0, len(data), (16,))
        loss = F.cross_entropy(model(data[index]), targets[index])
        run.backward(loss)
        opt.step()
        opt.zero_grad()
        if rank == 1 and it + 1 == cfg["stop_rank1_at"] and not os.path.exists("told.txt"):
            open("told.txt", "w").close()  # once: a resumed attempt may train this step again
            run.context.request_stop("preempted", "rank 1 was told its machine goes away")
        if rank == 1 and it + 1 == cfg["crash_rank1_at"] and not os.path.exists("crashed.txt"):
            open("crashed.txt", "w").close()  # once: torchrun restarts the workers
            raise RuntimeError("rank 1 crashed")
        log.write(f"{os.getpid()} {it + 1} {loss.item():.8f}\n")
        log.flush()
        run.step(loss=loss)
if rank == 0:
    torch.save({"model": model.module.state_dict(), "optimizer": opt.state_dict()}, out)
dist.destroy_process_group()
