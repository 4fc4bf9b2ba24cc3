"""An epoch loop whose validation loss improves, then stops improving (scripted per epoch so
the early stop lands where a test expects it; the training itself is real), followed by the
code scripts put after training: save the final weights, write what the run says. With
`nan_at` set the loss turns NaN at that step instead: a sick run. `export_s` makes the export
take that long (it writes `exporting` first): a test preempts the machine during it."""

import json
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import prudent

run = prudent.init(name="early", config={"epochs": 12, "nan_at": 0, "export_s": 0.0})
cfg = run.config
val_losses = [1.0, 0.8, 0.7, 0.75, 0.72, 0.71, 0.74, 0.9, 0.8, 0.7, 0.6, 0.5]
torch.manual_seed(0)
x = torch.randn(256, 8)
loader = DataLoader(TensorDataset(x, (x[:, 0] > 0).long()), batch_size=32, shuffle=True)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
run.attach(model=model, optimizer=opt)
with run:
    for epoch in run.epochs(cfg["epochs"]):
        for xb, yb in run.batches(loader):
            loss = F.cross_entropy(model(xb), yb)
            if cfg["nan_at"] and run.state.step + 1 == cfg["nan_at"]:
                loss = loss * float("nan")
            run.backward(loss)
            opt.step()
            opt.zero_grad()
            run.step(loss=loss)
        run.log(val_loss=val_losses[epoch])
# after training: what a script exports, reached only when the training ended well
if cfg["export_s"]:
    open("exporting", "w").close()
    time.sleep(cfg["export_s"])
torch.save(model.state_dict(), "final.pt")
with open("after.json", "w") as out:
    json.dump({"status": run.status, "stop_reason": run.stop_reason,
               "stopped_early": run.stopped_early, "epoch": run.state.epoch}, out)
