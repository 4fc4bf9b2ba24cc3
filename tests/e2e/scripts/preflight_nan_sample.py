"""Bug: one corrupted sample (a NaN pixel) in the training data; the loss on its batch is NaN."""

import torch
from preflight_common import (
    CONFIG,
    accuracy,
    digits_arrays,
    loaders,
    mlp,
    split,
    train_epoch,
)

import prudent

run = prudent.init(name="nan-sample", config=CONFIG)
torch.manual_seed(run.config["seed"])
images, labels = digits_arrays()
images[1000, 17] = float("nan")  # a corrupted record, as a bad row in a CSV would give
train, val = split(torch.tensor(images, dtype=torch.float32), torch.tensor(labels))
train_loader, val_loader = loaders(train, val, run.config["batch_size"])
model = mlp()
opt = torch.optim.AdamW(model.parameters(), lr=run.config["lr"])
run.attach(model=model, optimizer=opt)
with run:
    for epoch in run.epochs(run.config["epochs"]):
        train_epoch(run, model, opt, train_loader)
        run.log(val_acc=accuracy(model, val_loader))
