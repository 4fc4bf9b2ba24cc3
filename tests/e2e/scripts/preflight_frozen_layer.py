"""Bug: torch.no_grad() meant for a frozen embedding also wraps the encoder, which never trains."""

import torch
from preflight_common import CONFIG, accuracy, digits_loaders, train_epoch
from torch import nn

import prudent


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(64, 64), nn.ReLU())
        self.head = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():  # the bug: the encoder should be outside this block
            h = self.encoder(x)
        return self.head(h)


run = prudent.init(name="frozen-layer", config=CONFIG)
torch.manual_seed(run.config["seed"])
train_loader, val_loader = digits_loaders(run.config["batch_size"])
model = Net()
opt = torch.optim.AdamW(model.parameters(), lr=run.config["lr"])
run.attach(model=model, optimizer=opt)
with run:
    for epoch in run.epochs(run.config["epochs"]):
        train_epoch(run, model, opt, train_loader)
        run.log(val_acc=accuracy(model, val_loader))
