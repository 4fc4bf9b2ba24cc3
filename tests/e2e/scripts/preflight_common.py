"""Shared pieces of the preflight bug scripts: sklearn's bundled digits and a tiny MLP.

Each ``preflight_*.py`` script is a healthy training script with one bug of the kind that
surfaces only later in a cloud run; the bug is in the script itself, not in here.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

CONFIG = {"lr": 3e-3, "epochs": 20, "batch_size": 32, "seed": 0}


def digits_arrays() -> tuple:
    """Features (float64 numpy, as sklearn gives them, scaled to [0, 1]) and labels."""
    images, labels = load_digits(return_X_y=True)
    return images / 16.0, labels


def split(x: torch.Tensor, y: torch.Tensor, seed: int = 0) -> tuple:
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    train, val = order[:1437], order[1437:]
    return (x[train], y[train]), (x[val], y[val])


def loaders(train: tuple, val: tuple, batch_size: int, seed: int = 0) -> tuple:
    train_loader = DataLoader(TensorDataset(*train), batch_size=batch_size, shuffle=True,
                              generator=torch.Generator().manual_seed(seed))
    return train_loader, DataLoader(TensorDataset(*val), batch_size=256)


def mlp(hidden: int = 64) -> nn.Module:
    return nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))


@torch.no_grad()
def accuracy(model: nn.Module, loader: DataLoader) -> float:
    model.eval()
    correct = total = 0
    for x, y in loader:
        correct += (model(x).argmax(1) == y).sum().item()
        total += len(y)
    model.train()
    return correct / total


def train_epoch(run, model: nn.Module, opt: torch.optim.Optimizer, loader: DataLoader) -> None:
    for x, y in run.batches(loader):
        loss = F.cross_entropy(model(x), y)
        run.backward(loss)
        opt.step()
        opt.zero_grad()
        run.step(loss=loss)


def digits_loaders(batch_size: int, seed: int = 0) -> tuple:
    """Healthy train and validation loaders (float32 features, int64 labels)."""
    x, y = digits_arrays()
    return loaders(*split(torch.tensor(x, dtype=torch.float32), torch.tensor(y), seed),
                   batch_size, seed)
