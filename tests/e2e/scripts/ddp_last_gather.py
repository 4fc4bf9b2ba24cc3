"""A gloo job whose script's last act is an ``all_gather``, then the interpreter's exit.

After the run the script keeps the GIL (a switch interval of 100 s), and the test keeps the
job to one CPU: a gloo worker thread then mostly releases the collective's tensors only once
the interpreter is finalizing. That aborted the process ("terminate called without an
active exception", SIGABRT), as it did in about 1 job in 14 on a loaded 2-core machine,
but for the grace prudent gives gloo's workers at exit."""

import sys

import torch
import torch.distributed as dist

import prudent

dist.init_process_group("gloo")
run = prudent.init(name="last-gather")
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
run.attach(model=model, optimizer=opt)
with run:
    for step in run.steps(20):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        run.backward(loss)
        opt.step()
        opt.zero_grad()
        run.step(loss=loss)
sys.setswitchinterval(100)
flat = torch.ones(10)
both = [torch.zeros_like(flat) for _ in range(dist.get_world_size())]
dist.all_gather(both, flat)
