"""A small real training run: an MLP on scikit-learn's bundled 8x8 digits (no download).

    python examples/digits.py                          # plain, prudent registers the run itself
    prudent run -- python examples/digits.py           # supervised
    prudent run --set lr=0.003 --set epochs=8 -- python examples/digits.py

Reaches about 97% validation accuracy in a few seconds on 2 CPU cores.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import prudent


def digits_loaders(batch_size: int, seed: int = 0) -> tuple[DataLoader, DataLoader]:
    images, labels = load_digits(return_X_y=True)
    x = torch.tensor(images, dtype=torch.float32) / 16.0
    y = torch.tensor(labels, dtype=torch.long)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    train, val = order[:1437], order[1437:]  # 80 / 20
    train_loader = DataLoader(TensorDataset(x[train], y[train]), batch_size=batch_size,
                              shuffle=True, generator=torch.Generator().manual_seed(seed))
    val_loader = DataLoader(TensorDataset(x[val], y[val]), batch_size=256)
    return train_loader, val_loader


class Net(nn.Module):
    def __init__(self, hidden: int, dropout: float) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(64, hidden), nn.ReLU(), nn.Dropout(dropout),
            nn.Linear(hidden, hidden), nn.ReLU(), nn.Dropout(dropout),
            nn.Linear(hidden, 10),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


@torch.no_grad()
def evaluate(model: nn.Module, loader: DataLoader, device: torch.device) -> tuple[float, float]:
    model.eval()
    correct, total, loss_sum = 0, 0, 0.0
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        logits = model(x)
        loss_sum += F.cross_entropy(logits, y, reduction="sum").item()
        correct += (logits.argmax(1) == y).sum().item()
        total += len(y)
    model.train()
    return correct / total, loss_sum / total


def main() -> None:
    run = prudent.init(name="digits", config={
        "lr": 3e-3, "epochs": 10, "batch_size": 32, "hidden": 128, "dropout": 0.1, "seed": 0})
    cfg = run.config
    torch.manual_seed(cfg["seed"])
    train_loader, val_loader = digits_loaders(cfg["batch_size"], cfg["seed"])
    model = Net(cfg["hidden"], cfg["dropout"]).to(run.device)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"])
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=cfg["epochs"])
    run.attach(model=model, optimizer=opt, scheduler=sched)
    with run:
        for _epoch in run.epochs(cfg["epochs"]):
            for x, y in run.batches(train_loader):
                x, y = x.to(run.device), y.to(run.device)
                loss = F.cross_entropy(model(x), y)
                run.backward(loss)
                opt.step()
                opt.zero_grad()
                run.step(loss=loss)
            sched.step()
            val_acc, val_loss = evaluate(model, val_loader, run.device)
            run.log(val_acc=val_acc, val_loss=val_loss)
    print(f"final validation accuracy {val_acc:.4f}")


if __name__ == "__main__":
    main()
