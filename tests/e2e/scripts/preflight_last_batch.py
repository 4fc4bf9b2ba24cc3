"""Bug: the model reshapes with a hard-coded batch size; the epoch's last, smaller batch breaks it.

1437 training samples in batches of 32: the last batch has 29, reached only at the end of the
first epoch.
"""

import torch
from preflight_common import CONFIG, accuracy, digits_loaders, train_epoch
from torch import nn

import prudent

BATCH_SIZE = 32


class ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 8, 3, padding=1)
        self.head = nn.Linear(8 * 8 * 8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        images = x.view(BATCH_SIZE, 1, 8, 8)  # the bug: x.view(-1, 1, 8, 8)
        return self.head(torch.relu(self.conv(images)).flatten(1))


run = prudent.init(name="last-batch", config={**CONFIG, "batch_size": BATCH_SIZE})
torch.manual_seed(run.config["seed"])
train_loader, _ = digits_loaders(run.config["batch_size"])
val_loader = torch.utils.data.DataLoader(train_loader.dataset, batch_size=BATCH_SIZE,
                                         drop_last=True)  # evaluation was made to fit
model = ConvNet()
opt = torch.optim.AdamW(model.parameters(), lr=run.config["lr"])
run.attach(model=model, optimizer=opt)
with run:
    for epoch in run.epochs(run.config["epochs"]):
        train_epoch(run, model, opt, train_loader)
        run.log(val_acc=accuracy(model, val_loader))
