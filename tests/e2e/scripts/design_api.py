"""The public API exactly as DESIGN.md shows it, on generated data (no download)."""

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import prudent


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 2))

    def forward(self, x):
        return self.layers(x)


generator = torch.Generator().manual_seed(0)
features = torch.randn(256, 8, generator=generator)
labels = (features[:, 0] + features[:, 1] > 0).long()
train_loader = DataLoader(TensorDataset(features[:192], labels[:192]), batch_size=16, shuffle=True)


def evaluate(model):
    model.eval()
    with torch.no_grad():
        accuracy = (model(features[192:]).argmax(1) == labels[192:]).float().mean().item()
    model.train()
    return accuracy


run = prudent.init(name="digits", config={"lr": 1e-3, "epochs": 5})
cfg = run.config                       # hyperparameters after `prudent run --set` or the tuner
model = Net()
opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"])
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2)
run.attach(model=model, optimizer=opt, scheduler=sched)   # saved in checkpoints; restored now if resuming
with run:                              # a clean stop (preemption, budget, rule, pruning) unwinds to here
    for epoch in run.epochs(cfg["epochs"]):          # starts at the restored epoch
        for x, y in run.batches(train_loader):       # skips batches already done; times the wait for data
            loss = F.cross_entropy(model(x), y)
            run.backward(loss)                       # backward + gradient statistics
            opt.step(); opt.zero_grad()  # noqa: E702 - as DESIGN.md writes it
            run.step(loss=loss)                      # metrics, rules, checkpoint when due, budget, preemption
        run.log(val_acc=evaluate(model))             # evaluation metrics; the tuner reads these
print(f"done lr={cfg['lr']} epochs={cfg['epochs']} run={run.id}")
