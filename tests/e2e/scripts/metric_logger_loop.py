"""torchvision's classification reference loop, in our own words: the epoch's body is a
function, and the batches pass through a progress logger (a generator, like its
``MetricLogger.log_every``) that calls ``len()`` on what it is given and, after each batch,
prints averages of meters that the body updated. Random crops and flips drawn in the dataset
on the global generator (workers=0), an LR scheduler stepped per epoch, evaluation each epoch.

prudent goes where the script reads its loader: ``log_every(run.batches(loader), ...)``.
(Around the logger, ``run.batches(log_every(loader))``, a resumed epoch would be skipped by
reading and discarding through the logger, whose code after each ``yield`` then runs without
the body: this logger divides by zero, as torchvision's does.) ``term_at``: the process sends
itself SIGTERM once, after that step. The final model is written to ``out``.
"""

import os
import signal

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

import prudent

torch.set_num_threads(1)
run = prudent.init(name="metric-logger", config={"epochs": 3, "term_at": 0,
                                                 "out": "final.pt"})
cfg = run.config
term_at, out = cfg["term_at"], cfg["out"]
torch.manual_seed(0)
images = torch.randn(60, 3, 10, 10)
labels = torch.arange(60) % 3


class Cropped(Dataset):
    def __len__(self):
        return len(images)

    def __getitem__(self, i):
        x, y0 = images[i], int(torch.randint(0, 3, ()))
        x = x[:, y0:y0 + 8, y0:y0 + 8]
        return (x.flip(-1) if torch.rand(()) < 0.5 else x), labels[i]


class Meter:
    def __init__(self):
        self.total, self.count = 0.0, 0

    def __str__(self):
        return f"{self.total / self.count:.4f}"  # fails before the body's first update


def log_every(iterable, meter):
    for i, obj in enumerate(iterable):
        yield obj
        print(f"[{i}/{len(iterable)}] loss {meter}")


def train_one_epoch(model, opt, loader):
    meter = Meter()
    for x, y in log_every(run.batches(loader), meter):
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        run.step(loss=loss)
        meter.total, meter.count = meter.total + loss.item(), meter.count + 1
        if run.state.step == term_at and not os.path.exists("termed"):
            open("termed", "w").close()
            os.kill(os.getpid(), signal.SIGTERM)


model = nn.Sequential(nn.Flatten(), nn.Linear(192, 32), nn.ReLU(), nn.Dropout(0.2),
                      nn.Linear(32, 3))
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
loader = DataLoader(Cropped(), batch_size=8, sampler=torch.utils.data.RandomSampler(Cropped()))
run.attach(model=model, optimizer=opt, lr_scheduler=sched)
with run:
    for epoch in run.epochs(cfg["epochs"]):
        train_one_epoch(model, opt, loader)
        sched.step()
        with torch.no_grad():
            run.log(val_loss=F.cross_entropy(model(images[:, :, :8, :8]), labels).item())
torch.save(model.state_dict(), out)
