"""FSDP2 on CPU (gloo), two ranks: every Linear and the root `fully_shard`-ed on a 1-D mesh,
AdamW, a shuffled DistributedSampler, 100 steps. Every rank appends "<pid> <step> <norm>" to
`rank<r>.log` for each step it completed, <norm> being torch's own global gradient norm of
that step (the reference for the monitor's); with `nan_rank1_at` set, rank 1's loss alone is
NaN at that step; with `stop_rank1_at` set, rank 1 alone asks to stop at that step (a
preemption notice); with `out` set, the gathered full model and optimizer are saved there at
the end. `wrap` makes the same model FSDP2's (`fsdp2`), DDP's (`ddp`) or left bare (`none`):
a checkpoint of one resumes under another; with `stop_at` set, the last rank asks to stop at
that step, once; with `start_out` set, the full model and optimizer as attached (resumed)
are saved there before training."""

import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import prudent

torch.set_num_threads(1)
dist.init_process_group("gloo")
mesh = init_device_mesh("cpu", (dist.get_world_size(),))
run = prudent.init(name="fsdp2", config={"epochs": 2, "nan_rank1_at": 0, "stop_rank1_at": 0,
                                         "out": "", "wrap": "fsdp2", "stop_at": 0,
                                         "start_out": ""})
cfg = run.config
out, start_out = cfg["out"], cfg["start_out"]  # read with the others, not only at the end
rank, last_rank = dist.get_rank(), dist.get_world_size() - 1
torch.manual_seed(0)
features = torch.randn(800, 8)
dataset = TensorDataset(features, (features[:, 0] + 0.5 * features[:, 1] > 0).long())
loader = DataLoader(dataset, batch_size=8, sampler=DistributedSampler(dataset, seed=3))
model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 2))
if cfg["wrap"] == "fsdp2":
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
elif cfg["wrap"] == "ddp":
    model = nn.parallel.DistributedDataParallel(model)
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
run.attach(model=model, optimizer=opt)


def save_full(path):
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    full = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_state, optimizer_state = get_state_dict(model, opt, options=full)  # every rank
    if rank == 0:
        torch.save({"model": model_state, "optimizer": optimizer_state}, path)


def norm_value(norm):
    return (norm.full_tensor() if hasattr(norm, "full_tensor") else norm).item()


if start_out:
    save_full(start_out)
with run, open(f"rank{rank}.log", "a") as log:
    for epoch in run.epochs(cfg["epochs"]):
        for x, y in run.batches(loader):
            loss = F.cross_entropy(model(x), y)
            if rank == 1 and run.state.step + 1 == cfg["nan_rank1_at"]:
                loss = loss * float("nan")
            run.backward(loss)
            norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])
            opt.step()
            opt.zero_grad()
            if rank == 1 and run.state.step + 1 == cfg["stop_rank1_at"] \
                    and not os.path.exists("told.txt"):
                open("told.txt", "w").close()  # once: a resumed attempt may train it again
                run.context.request_stop("preempted", "rank 1 was told its machine goes away")
            told = f"told-{cfg['stop_at']}.txt"
            if rank == last_rank and run.state.step + 1 == cfg["stop_at"] \
                    and not os.path.exists(told):
                open(told, "w").close()
                run.context.request_stop("preempted", "the last rank's machine goes away")
            log.write(f"{os.getpid()} {run.state.step + 1} {norm_value(norm)!r}\n")
            log.flush()
            run.step(loss=loss)
if out:
    save_full(out)
dist.destroy_process_group()
