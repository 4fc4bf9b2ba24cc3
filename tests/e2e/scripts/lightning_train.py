"""examples/lightning_digits.py's model and data with the knobs the adapter's e2e tests need:
`nan_at_step` puts a NaN into one batch, `sleep_s` slows each step so a test can signal it
mid-epoch, `kill_at_step` makes the process vanish (SIGKILL, as a reclaimed machine) as that
step starts, `out` is where the final weights go, `resumable` wraps the training loader in
prudent.lightning.resumable, `tensorboard` gives the Trainer a TensorBoardLogger in tb/lit,
`term_at_step` sends the process SIGTERM (once: a `termed` file marks it) as that step starts,
`logger` gives it another of Lightning's loggers: "csv" (in csv/lit, written out every
`csv_flush_every` steps), "mlflow" (experiment
"lit" at MLFLOW_TRACKING_URI) or "wandb" (project "lit", W&B's mode and folder from WANDB_*).
Each optimizer step appends "<pid> <step>" to steps.log.
"""

import os
import signal
import sys
import time
from pathlib import Path

import lightning as L
import torch

sys.path.insert(0, str(Path(__file__).parents[3] / "examples"))
from lightning_digits import LitDigits, digits_loaders  # noqa: E402

from prudent.lightning import PrudentCallback, resumable  # noqa: E402

torch.set_num_threads(1)


class Knobs(LitDigits):
    def __init__(self, nan_at_step: int, sleep_s: float, kill_at_step: int,
                 **kwargs: float) -> None:
        super().__init__(**kwargs)
        self.nan_at_step, self.sleep_s, self.kill_at_step = nan_at_step, sleep_s, kill_at_step

    def training_step(self, batch, idx):
        if self.global_step + 1 == cfg["term_at_step"] and not os.path.exists("termed"):
            open("termed", "w").close()
            os.kill(os.getpid(), signal.SIGTERM)
        if self.global_step + 1 == self.kill_at_step:
            time.sleep(0.5)  # the newest checkpoint's background write lands first
            os.kill(os.getpid(), signal.SIGKILL)
        x, y = batch
        if self.global_step + 1 == self.nan_at_step:
            x = x.clone()
            x[0, 0] = float("nan")
        loss = super().training_step((x, y), idx)
        time.sleep(self.sleep_s)
        return loss

    def on_train_batch_end(self, outputs, batch, idx):
        with open("steps.log", "a") as log:
            log.write(f"{os.getpid()} {self.global_step}\n")


cb = PrudentCallback(name="lightning-train", config={
    "lr": 0.05, "hidden": 32, "max_epochs": 3, "batch_size": 64, "nan_at_step": -1,
    "sleep_s": 0.0, "kill_at_step": -1, "out": "final.pt", "resumable": True,
    "tensorboard": False, "term_at_step": -1, "logger": "", "csv_flush_every": 100})
cfg = cb.config
out = cfg["out"]  # read with the others, not only once training is over
L.seed_everything(0, verbose=False)
train_loader, val_loader = digits_loaders(cfg["batch_size"])
model = Knobs(cfg["nan_at_step"], cfg["sleep_s"], cfg["kill_at_step"], lr=cfg["lr"],
              hidden=cfg["hidden"])
loggers = {"csv": lambda: L.pytorch.loggers.CSVLogger(
               "csv", name="lit", flush_logs_every_n_steps=cfg["csv_flush_every"]),
           "mlflow": lambda: L.pytorch.loggers.MLFlowLogger(experiment_name="lit"),
           "wandb": lambda: L.pytorch.loggers.WandbLogger(project="lit")}
logger = L.pytorch.loggers.TensorBoardLogger("tb", name="lit") if cfg["tensorboard"] else False
if cfg["logger"]:
    logger = loggers[cfg["logger"]]()
trainer = L.Trainer(max_epochs=cfg["max_epochs"], callbacks=[cb], accelerator="cpu",
                    logger=logger, log_every_n_steps=1, enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False, deterministic=True)
if cfg["resumable"]:
    train_loader = resumable(train_loader)
trainer.fit(model, train_loader, val_loader, ckpt_path=cb.resume_path())
torch.save(model.state_dict(), out)
print(f"DONE {trainer.global_step}")
