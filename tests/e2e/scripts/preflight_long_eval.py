"""A healthy digits loop whose evaluation, at its third step, takes minutes (a sleep standing
in for a long validation pass): a SIGTERM asks prudent to stop at the next step, which is
minutes away. Entering the evaluation, it writes its pid to ``evaluating.pid``."""

import os
import time

import torch
import torch.nn.functional as F
from preflight_common import CONFIG, digits_arrays, loaders, mlp, split

import prudent

run = prudent.init(name="long-eval", config=CONFIG)
cfg = run.config
torch.manual_seed(cfg["seed"])
x, y = digits_arrays()
train, val = split(torch.tensor(x, dtype=torch.float32), torch.tensor(y))
train_loader, _ = loaders(train, val, cfg["batch_size"])
model = mlp()
opt = torch.optim.Adam(model.parameters(), lr=cfg["lr"])
run.attach(model=model, optimizer=opt)
with run:
    for epoch in run.epochs(cfg["epochs"]):
        for xb, yb in run.batches(train_loader):
            if run.state.step == 2:
                with open("evaluating.pid", "a") as marker:
                    marker.write(f"{os.getpid()}\n")
                time.sleep(300)  # "the validation pass"
            loss = F.cross_entropy(model(xb), yb)
            run.backward(loss)
            opt.step()
            opt.zero_grad()
            run.step(loss=loss)
