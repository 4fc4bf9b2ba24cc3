"""Bug: the evaluation code, first reached after the first epoch, uses an undefined name."""

import torch
from preflight_common import CONFIG, accuracy, digits_loaders, mlp, train_epoch

import prudent

run = prudent.init(name="eval-crash", config=CONFIG)
torch.manual_seed(run.config["seed"])
train_loader, val_loader = digits_loaders(run.config["batch_size"])
model = mlp()
opt = torch.optim.AdamW(model.parameters(), lr=run.config["lr"])
run.attach(model=model, optimizer=opt)
best_acc = 0.0
with run:
    for epoch in run.epochs(run.config["epochs"]):
        train_epoch(run, model, opt, train_loader)
        val_acc = accuracy(model, val_loader)
        best_acc = max(best_acc, val_acc)
        run.log(val_acc=val_acc, best_acc=best_val_acc)  # noqa: F821 - the bug: a stale name
