"""Train a tiny model slowly for `steps` steps with trackers configured in prudent.yaml; prints
READY after the first step. Each step's loss is logged with its `step` as a metric, so a
reader can see the curve is one line."""

import time

import torch

import prudent

run = prudent.init(name="tracked", config={"steps": 60, "sleep_s": 0.03, "lr": 0.05})
cfg = run.config
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=cfg["lr"])
run.attach(model=model, optimizer=opt)
x, y = torch.randn(32, 4), torch.randn(32, 1)
with run:
    for it in run.steps(cfg["steps"]):
        loss = torch.nn.functional.mse_loss(model(x), y)
        run.backward(loss)
        opt.step()
        opt.zero_grad()
        run.step(loss=loss, it=float(it))
        if it == 0:
            print("READY", flush=True)
        time.sleep(cfg["sleep_s"])
