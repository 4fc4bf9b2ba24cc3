"""PyTorch Lightning with prudent: a small MLP on scikit-learn's bundled 8x8 digits.

    python examples/lightning_digits.py                       # prudent registers the run itself
    prudent run --max-restarts 3 -- python examples/lightning_digits.py
    prudent run --set lr=0.02 --set max_epochs=8 -- python examples/lightning_digits.py
    prudent preflight -- python examples/lightning_digits.py

The prudent lines are marked ``# prudent``. Reaches about 97% validation accuracy in a few
seconds on 2 CPU cores.
"""

from __future__ import annotations

import lightning as L
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from prudent.lightning import PrudentCallback, resumable


class LitDigits(L.LightningModule):
    def __init__(self, lr: float = 0.05, hidden: int = 64) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                                 nn.ReLU(), nn.Linear(hidden, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], idx: int) -> None:
        x, y = batch
        logits = self(x)
        self.log_dict({"val_loss": F.cross_entropy(logits, y),
                       "val_acc": (logits.argmax(1) == y).float().mean()})

    def configure_optimizers(self) -> torch.optim.Optimizer:
        # self.hparams.lr: `prudent run --set lr=...` and the tuner reach it through the callback
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)


def digits_loaders(batch_size: int, seed: int = 0) -> tuple[DataLoader, DataLoader]:
    images, labels = load_digits(return_X_y=True)
    x = torch.tensor(images, dtype=torch.float32) / 16.0
    y = torch.tensor(labels, dtype=torch.long)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    train, val = order[:1437], order[1437:]  # 80 / 20
    return (DataLoader(TensorDataset(x[train], y[train]), batch_size=batch_size, shuffle=True),
            DataLoader(TensorDataset(x[val], y[val]), batch_size=256))


def main() -> None:
    prudent_cb = PrudentCallback(name="lightning-digits", config={  # prudent
        "lr": 0.05, "hidden": 64, "max_epochs": 6, "batch_size": 32, "seed": 0})
    cfg = prudent_cb.config  # prudent: the hyperparameters after --set or the tuner
    L.seed_everything(cfg["seed"], verbose=False)
    train_loader, val_loader = digits_loaders(cfg["batch_size"], cfg["seed"])
    model = LitDigits(lr=cfg["lr"], hidden=cfg["hidden"])
    trainer = L.Trainer(max_epochs=cfg["max_epochs"], callbacks=[prudent_cb],  # prudent
                        accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, resumable(train_loader), val_loader,  # prudent: exact mid-epoch resume
                ckpt_path=prudent_cb.resume_path())  # prudent: where a resumed run continues
    print(f"final validation accuracy {trainer.callback_metrics['val_acc']:.4f}")


if __name__ == "__main__":
    main()
