"""DDP on 2 ranks where only rank 1 meets a mislabelled batch every 40 steps from step 150
(4 of its 32 labels wrong, on fresh data: a level that does not grow). The first few are
skipped on both ranks, then they are the run's own tail and trained. A rule of the script's
own that never fires writes the tail steps each rank's checks saw to tail-<rank>.txt (they
must be alike: one rank's known hard batch is no evidence on the other), and rank 0 writes
the largest difference between the two ranks' final weights to replicas.txt."""

import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

import prudent
from prudent.monitor import register_rule
from prudent.monitor.base import Rule


class TailSeen(Rule):
    """Writes down each check's ``window.tail``; never fires."""

    name = "tail_seen"
    seen: list[int] = []

    def check(self, window):
        TailSeen.seen += sorted(window.tail)
        return None


register_rule(TailSeen)
dist.init_process_group("gloo")
run = prudent.init(name="ddp-tail")
rank = int(os.environ["RANK"])
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
ddp = torch.nn.parallel.DistributedDataParallel(model)
opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
run.attach(model=ddp, optimizer=opt)
draws = torch.Generator().manual_seed(100 + rank)  # each rank its own data
teacher = torch.randn(16, 4, generator=torch.Generator().manual_seed(7))
with run:
    for step in run.steps(int(os.environ.get("STEPS", "1000"))):
        x = torch.randn(32, 16, generator=draws)
        y = (x @ teacher).argmax(1)
        if rank == 1 and step >= 149 and (step - 149) % 40 == 0:
            y[:4] = (y[:4] + 1) % 4
        loss = F.cross_entropy(ddp(x), y)
        run.backward(loss)
        opt.step()
        opt.zero_grad()
        run.step(loss=loss)
Path(f"tail-{rank}.txt").write_text(" ".join(map(str, TailSeen.seen)) + "\n")
flat = torch.cat([p.detach().flatten() for p in model.parameters()])
both = [torch.zeros_like(flat) for _ in range(2)]
dist.all_gather(both, flat)
if rank == 0:
    Path("replicas.txt").write_text(f"{(both[0] - both[1]).abs().max().item()}\n")
dist.destroy_process_group()
