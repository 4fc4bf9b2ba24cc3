"""The `pytorch_lightning` package (not `lightning`) with prudent's callback: a small MLP on
generated data for one epoch."""

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from prudent.lightning import PrudentCallback


class Net(pl.LightningModule):
    def __init__(self, lr: float) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))

    def training_step(self, batch, idx):
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


cb = PrudentCallback(name="pl-train", config={"lr": 0.1})
pl.seed_everything(0, verbose=False)
x = torch.randn(256, 8)
loader = DataLoader(TensorDataset(x, (x[:, 0] > 0).long()), batch_size=32, shuffle=True)
trainer = pl.Trainer(max_epochs=1, callbacks=[cb], accelerator="cpu", logger=False,
                     enable_checkpointing=False, enable_progress_bar=False,
                     enable_model_summary=False)
trainer.fit(Net(0.5), loader, ckpt_path=cb.resume_path())
print(f"DONE {trainer.global_step} lr={trainer.optimizers[0].param_groups[0]['lr']}")
