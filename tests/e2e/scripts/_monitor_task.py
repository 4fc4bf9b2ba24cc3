"""Shared pieces of the monitor scenarios: generated data, small models, the training loop.

Each ``monitor_*.py`` script is a real training run on the CPU that is sick in one way (or
healthy). It prints ``SCENARIO planned=<steps> onset=<step>`` first, so the tests and
``benchmarks/monitor.py`` know how long it meant to train and when the sickness began.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import prudent

torch.set_num_threads(1)

# MONITOR_SEED (benchmarks/monitor.py: healthy runs over several seeds) shifts every seed below;
# MONITOR_HEALTHY=1 turns a repairable sickness off (the reference a repair is measured against)
SEED = int(os.environ.get("MONITOR_SEED", "0"))
HEALTHY = os.environ.get("MONITOR_HEALTHY") == "1"


def blobs(n: int = 4096, features: int = 32, classes: int = 10, seed: int = 0,
          spread: float = 0.4) -> tuple[torch.Tensor, torch.Tensor]:
    """Gaussian clusters, one per class: learnable, but not in a handful of steps."""
    generator = torch.Generator().manual_seed(seed + 1000 * SEED)
    centers = torch.randn(classes, features, generator=generator) * spread
    y = torch.randint(0, classes, (n,), generator=generator)
    x = centers[y] + torch.randn(n, features, generator=generator)
    return x, y


def waves(n: int = 4096, features: int = 32, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A smooth regression target with a little noise."""
    generator = torch.Generator().manual_seed(seed + 1000 * SEED)
    x = torch.randn(n, features, generator=generator)
    direction = torch.randn(features, 1, generator=generator)
    return x, torch.sin(x @ direction / 4) + 0.1 * torch.randn(n, 1, generator=generator)


def loaders(x: torch.Tensor, y: torch.Tensor, batch_size: int = 32,
            num_val: int = 512, seed: int = 0) -> tuple[DataLoader, DataLoader]:
    train = TensorDataset(x[num_val:], y[num_val:])
    val = TensorDataset(x[:num_val], y[:num_val])
    return (DataLoader(train, batch_size=batch_size, shuffle=True,
                       generator=torch.Generator().manual_seed(seed + 1000 * SEED)),
            DataLoader(val, batch_size=256))


def mlp(features: int = 32, hidden: int = 64, classes: int = 10, depth: int = 2,
        act: type[nn.Module] = nn.ReLU, seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed + 1000 * SEED)
    layers: list[nn.Module] = []
    width = features
    for _ in range(depth):
        layers += [nn.Linear(width, hidden), act()]
        width = hidden
    return nn.Sequential(*layers, nn.Linear(width, classes))


@torch.no_grad()
def evaluate(model: nn.Module, loader: DataLoader,
             loss_fn: Callable[..., torch.Tensor] = F.cross_entropy) -> dict[str, float]:
    model.eval()
    total, loss_sum = 0, 0.0
    for x, y in loader:
        loss_sum += float(loss_fn(model(x), y, reduction="sum"))
        total += len(y)
    model.train()
    return {"val_loss": loss_sum / total}


@torch.no_grad()
def accuracy(model: nn.Module, loader: DataLoader) -> dict[str, float]:
    """Only an accuracy, as many classification scripts log."""
    model.eval()
    right = total = 0
    for x, y in loader:
        right += int((model(x).argmax(1) == y).sum())
        total += len(y)
    model.train()
    return {"val_acc": right / total}


class ShardedLoader:
    """A loader whose batches ``bad`` (positions in epoch ``bad_epoch``) come from a corrupted
    shard: ``spoil(batch)`` is applied to them. Skipping batches skips the shard itself."""

    def __init__(self, loader: DataLoader, bad_epoch: int, bad: range,
                 spoil: Callable[[Any], Any]) -> None:
        self.loader, self.bad_epoch, self.bad, self.spoil = loader, bad_epoch, bad, spoil
        self.epoch = -1

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):  # type: ignore[no-untyped-def]
        self.epoch += 1
        for index, batch in enumerate(self.loader):
            corrupt = self.epoch == self.bad_epoch and index in self.bad and not HEALTHY
            yield self.spoil(batch) if corrupt else batch


def announce(planned: int, onset: int | None = 0) -> None:
    print(f"SCENARIO planned={planned} onset={onset if onset is not None else 'none'}",
          flush=True)


def train(run: prudent.Run, model: nn.Module, opt: torch.optim.Optimizer, loader: Any,
          epochs: int, *, val_loader: DataLoader | None = None, sched: Any = None,
          sched_per_step: bool = False,
          loss_fn: Callable[..., torch.Tensor] = F.cross_entropy,
          before_step: Callable[[int, Any], Any] | None = None,
          after_step: Callable[[int, torch.Tensor], None] | None = None,
          onset: int | None = 0, evaluate_fn: Callable[..., dict[str, float]] | None = None,
          eval_every: int = 1, clip: float | None = None) -> None:
    """The loop of DESIGN.md, with hooks where a scenario makes itself sick."""
    announce(epochs * len(loader), onset)
    run.attach(model=model, optimizer=opt, **({"scheduler": sched} if sched else {}))
    with run:
        for epoch in run.epochs(epochs):
            for batch in run.batches(loader):
                step = run.state.step + 1
                x, y = before_step(step, batch) if before_step else batch
                loss = loss_fn(model(x), y)
                run.backward(loss)
                if clip is not None:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
                opt.step()
                opt.zero_grad()
                if sched is not None and sched_per_step:
                    sched.step()
                if after_step is not None:
                    after_step(step, loss)
                run.step(loss=loss)
            if sched is not None and not sched_per_step:
                sched.step()
            if val_loader is not None and (epoch + 1) % eval_every == 0:
                metrics = (evaluate_fn(model, val_loader) if evaluate_fn
                           else evaluate(model, val_loader, loss_fn))
                run.log(**metrics)
    print("COMPLETED", flush=True)
