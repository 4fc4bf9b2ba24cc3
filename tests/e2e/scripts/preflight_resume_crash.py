"""Bug: a custom stateful object whose load_state_dict expects a key its state_dict renamed.

Saving works (every checkpoint is written); only a resumed process, hours later in the cloud
after a preemption, calls load_state_dict, and crashes there.
"""

import torch
from preflight_common import CONFIG, accuracy, digits_loaders, mlp, train_epoch

import prudent


class BestTracker:
    """Remembers the best validation accuracy (for 'save the best model' logic)."""

    def __init__(self) -> None:
        self.best_acc = 0.0

    def update(self, acc: float) -> None:
        self.best_acc = max(self.best_acc, acc)

    def state_dict(self) -> dict:
        return {"best": self.best_acc}  # renamed from "best_acc" in a refactoring...

    def load_state_dict(self, state: dict) -> None:
        self.best_acc = state["best_acc"]  # ...but not here


run = prudent.init(name="resume-crash", config=CONFIG)
torch.manual_seed(run.config["seed"])
train_loader, val_loader = digits_loaders(run.config["batch_size"])
model = mlp()
opt = torch.optim.AdamW(model.parameters(), lr=run.config["lr"])
tracker = BestTracker()
run.attach(model=model, optimizer=opt, tracker=tracker)
with run:
    for epoch in run.epochs(run.config["epochs"]):
        train_epoch(run, model, opt, train_loader)
        tracker.update(accuracy(model, val_loader))
        run.log(val_acc=tracker.best_acc)
