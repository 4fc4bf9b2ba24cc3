"""Bug: optimizer.zero_grad() is missing, so gradients pile up across steps."""

import torch
import torch.nn.functional as F
from preflight_common import CONFIG, accuracy, digits_loaders, mlp

import prudent

run = prudent.init(name="no-zero-grad", config=CONFIG)
torch.manual_seed(run.config["seed"])
train_loader, val_loader = digits_loaders(run.config["batch_size"])
model = mlp()
opt = torch.optim.AdamW(model.parameters(), lr=run.config["lr"])
run.attach(model=model, optimizer=opt)
with run:
    for epoch in run.epochs(run.config["epochs"]):
        for x, y in run.batches(train_loader):
            loss = F.cross_entropy(model(x), y)
            run.backward(loss)
            opt.step()  # the bug: no opt.zero_grad()
            run.step(loss=loss)
        run.log(val_acc=accuracy(model, val_loader))
