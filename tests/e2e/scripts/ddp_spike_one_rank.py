"""DDP on 2 ranks where only rank 1 draws bad batches, each rank its own data. SPOIL=burst
(the default): inputs x50 at steps 251-253, an outlier on rank 1, not on rank 0. SPOIL=tail:
4 of its 32 labels wrong every 40 steps from step 150 (on fresh data: a level that does not
grow), which the run comes to know as its own tail.

Rank 0 writes the largest difference between the two ranks' final weights to replicas.txt
(0.0: the replicas stayed one model). A rule of the script's own that never fires writes the
tail steps each rank's checks saw to tail-<rank>.txt (one rank's known hard batch must be no
evidence on the other either)."""

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


def spoiled(step: int) -> bool:
    if os.environ.get("SPOIL", "burst") == "tail":
        return step >= 149 and (step - 149) % 40 == 0
    return 250 <= step < 253


register_rule(TailSeen)
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
        if rank == 1 and spoiled(step):
            if os.environ.get("SPOIL", "burst") == "tail":
                y[:4] = (y[:4] + 1) % 4
            else:
                x = x * 50
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
