"""A cloud run that dies of one bad sample: row 1234 of the data has a NaN feature.

The loader shuffles, so the bad sample arrives at some step of the first epoch; the loss turns
NaN there. Usage: python replay_nan_sample.py [--other-model] [--capture-at STEP]: a refactored model
(for replay's key check); a capture of a healthy step on purpose (for a finite replayed loss).
"""

import sys

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import prudent

BAD_SAMPLE = 1234

torch.set_num_threads(1)
run = prudent.init(name="nan-sample", config={"lr": 1e-2, "epochs": 2, "dropout": 0.1})
generator = torch.Generator().manual_seed(0)
x = torch.randn(2048, 16, generator=generator)
y = (x[:, 0] + x[:, 1] > 0).long()
x[BAD_SAMPLE, 3] = float("nan")  # a sensor dropout nobody noticed in preprocessing
loader = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True,
                    generator=torch.Generator().manual_seed(1))

torch.manual_seed(0)
if "--other-model" in sys.argv:  # a refactor: no dropout, so the last layer's keys moved
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))
else:
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(run.config["dropout"]),
                          nn.Linear(32, 2))
capture_at = int(sys.argv[sys.argv.index("--capture-at") + 1]) if "--capture-at" in sys.argv else 0
opt = torch.optim.SGD(model.parameters(), lr=run.config["lr"], momentum=0.9)
run.attach(model=model, optimizer=opt)
with run:
    for epoch in run.epochs(run.config["epochs"]):
        for xb, yb in run.batches(loader):
            loss = F.cross_entropy(model(xb), yb)
            run.backward(loss)
            if run.state.step + 1 == capture_at:
                run.capture("user", "a healthy step, captured on purpose")
            opt.step()
            opt.zero_grad()
            run.step(loss=loss)
print("COMPLETED", flush=True)
