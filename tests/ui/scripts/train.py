"""A tiny real training run for the dashboard tests: a linear model on generated data.

``nan_at``: the loss turns NaN at that step (a poisoned batch), so the non_finite rule fires
and stops the run; ``crash_at``: the script raises there (a failed run); ``sleep_s``: each step
sleeps, so a test can watch the run while it writes; ``note``: a free-text config value.
"""

import time

import torch
import torch.nn.functional as F

import prudent

run = prudent.init(name="ui-train", config={"steps": 60, "lr": 0.05, "nan_at": -1,
                                            "crash_at": -1, "sleep_s": 0.0, "note": ""})
cfg = run.config
torch.manual_seed(0)
x = torch.randn(256, 8)
y = x @ torch.randn(8, 1) + 0.1 * torch.randn(256, 1)
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=cfg["lr"])
run.attach(model=model, optimizer=opt)
with run:
    for step in run.steps(cfg["steps"]):
        if step == cfg["crash_at"]:
            raise RuntimeError(f"the data loader died at step {step}")
        batch = torch.randint(0, 256, (32,))
        inputs = x[batch].clone()
        if step == cfg["nan_at"]:
            inputs[0, 0] = float("nan")
        loss = F.mse_loss(model(inputs), y[batch])
        run.backward(loss)
        opt.step()
        opt.zero_grad()
        run.step(loss=loss)
        if step % 10 == 9:  # not val_*: the early-stopping rules would end a plateau here
            run.log(eval_mse=loss.item() * 1.1, lr=opt.param_groups[0]["lr"])
        time.sleep(cfg["sleep_s"])
