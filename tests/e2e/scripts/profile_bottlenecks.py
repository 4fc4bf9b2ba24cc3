"""Real training with one contrived bottleneck, chosen with ``--set scenario=...``.

Delays are sleeps, so they are unambiguous on a busy machine: a step "computes" for 10 ms
(a tiny model plus a sleep standing in for device time) unless the scenario says otherwise.

    input_bound    every sample takes 5 ms to load (20 ms a batch), compute ~10 ms
    compute_bound  a wide MLP on one thread (tens of ms a step), data already in memory
    stalls         every 10th step stalls for 150 ms
    leak           every step keeps 2 MB more alive (the classic: a list of tensors)
    checkpoint     a 6 MB model saved at every step (with checkpoint: {every: 1steps, mode: sync})
"""

import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

import prudent


class SlowDataset(Dataset):
    """A dataset whose every sample takes ``delay_s`` to read, like a slow disk or decoder."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, delay_s: float) -> None:
        self.x, self.y, self.delay_s = x, y, delay_s

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        time.sleep(self.delay_s)
        return self.x[i], self.y[i]


run = prudent.init(name="bottleneck", config={"scenario": "compute_bound", "steps": 40,
                                              "batch_size": 4})
cfg = run.config
scenario = cfg["scenario"]
torch.set_num_threads(1)
torch.manual_seed(0)
width = {"compute_bound": 2048, "checkpoint": 1024}.get(scenario, 16)
features = torch.randn(cfg["steps"] * cfg["batch_size"], 256)
labels = (features[:, 0] > 0).long()
data = (SlowDataset(features, labels, 0.005) if scenario == "input_bound"
        else TensorDataset(features, labels))
loader = DataLoader(data, batch_size=cfg["batch_size"])
model = nn.Sequential(nn.Linear(256, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                      nn.Linear(width, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
run.attach(model=model, optimizer=opt)
kept = []
with run:
    for _epoch in run.epochs(1):
        for x, y in run.batches(loader):
            loss = F.cross_entropy(model(x), y)
            run.backward(loss)
            opt.step()
            opt.zero_grad()
            if scenario != "compute_bound":
                time.sleep(0.010)  # stands in for device time
            if scenario == "stalls" and (run.state.step + 1) % 10 == 0:
                time.sleep(0.150)
            if scenario == "leak":
                kept.append(torch.ones(512 * 1024))  # 2 MB a step, never released
            run.step(loss=loss)
        run.log(val_loss=float(loss))
print(f"done {scenario} run={run.id}")
