"""Mixed precision as on a GPU, on the CPU: bf16 autocast and an enabled GradScaler (its
state is attached, so it is checkpointed). `overflow_at` makes the gradients of those steps
infinite (a backward hook, as an fp16 overflow does; the loss stays finite), so the scaler
skips their updates and halves its scale; `kill_at_step` makes the process vanish (SIGKILL)
as that step ends; `out` gets the final weights and the scaler's scale. Each step appends
"<pid> <step>" to steps.log.
"""

import os
import signal

import torch

import prudent

run = prudent.init(name="amp", config={"steps": 200, "lr": 0.05, "overflow_at": [],
                                       "kill_at_step": -1, "out": "final.pt"})
cfg = run.config
out = cfg["out"]  # read with the others, not only once training is over
torch.manual_seed(0)
x = torch.randn(2048, 16)
y = (x[:, :4].sum(1) > 0).long()
model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=cfg["lr"], momentum=0.9)
scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 16)
batches = torch.Generator().manual_seed(0)
model[0].weight.register_hook(
    lambda grad: grad * float("inf") if run.state.step + 1 in cfg["overflow_at"] else grad)
run.attach(model=model, optimizer=optimizer, scaler=scaler, batches=batches)
with run:
    for step in run.steps(cfg["steps"]):
        ix = torch.randint(len(x), (64,), generator=batches)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(x[ix]).float(), y[ix])
        run.backward(loss)  # scaled by the attached scaler
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
        run.step(loss=loss)
        with open("steps.log", "a") as log:
            log.write(f"{os.getpid()} {run.state.step}\n")
        if run.state.step == cfg["kill_at_step"]:
            os.kill(os.getpid(), signal.SIGKILL)
torch.save({**model.state_dict(), "scale": torch.tensor(scaler.get_scale())}, out)
print(f"DONE {run.state.step} scale {scaler.get_scale()}")
