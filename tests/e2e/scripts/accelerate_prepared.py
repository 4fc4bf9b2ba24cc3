"""Hugging Face accelerate's no-trainer shape (its examples' ``cv_example.py``): model,
optimizer, a shuffled loader with 2 workers and a per-batch OneCycleLR all go through
``accelerator.prepare``, and prudent is given the prepared objects (a ``DataLoaderShard``, an
``AcceleratedOptimizer``, an ``AcceleratedScheduler``). Batches are dicts, random crops are
drawn in the workers, ``accelerator.backward``, ``set_seed``. ``term_at``: the process sends
itself SIGTERM once, after that step. The final model is written to ``out``.
"""

import os
import signal

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch import nn
from torch.utils.data import DataLoader, Dataset

import prudent

torch.set_num_threads(1)
run = prudent.init(name="accelerate", config={"epochs": 3, "lr": 3e-2, "term_at": 0,
                                              "out": "final.pt"})
cfg = run.config
term_at, out = cfg["term_at"], cfg["out"]
accelerator = Accelerator(cpu=True)
set_seed(42)
images = torch.randn(48, 3, 10, 10)


class Pets(Dataset):
    def __len__(self):
        return len(images)

    def __getitem__(self, i):
        y0, x0 = torch.randint(0, 3, (2,)).tolist()
        return {"image": images[i, :, y0:y0 + 8, x0:x0 + 8], "label": i % 3}


loader = DataLoader(Pets(), shuffle=True, batch_size=8, num_workers=2)
model = nn.Sequential(nn.Flatten(), nn.Linear(192, 32), nn.ReLU(), nn.Dropout(0.2),
                      nn.Linear(32, 3))
optimizer = torch.optim.Adam(model.parameters(), lr=cfg["lr"] / 25)
scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=cfg["lr"],
                                                epochs=cfg["epochs"], steps_per_epoch=len(loader))
model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
run.attach(model=model, optimizer=optimizer, lr_scheduler=scheduler)
with run:
    for epoch in run.epochs(cfg["epochs"]):
        model.train()
        for batch in run.batches(loader):
            loss = F.cross_entropy(model(batch["image"]), batch["label"])
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            run.step(loss=loss)
            if run.state.step == term_at and not os.path.exists("termed"):
                open("termed", "w").close()
                os.kill(os.getpid(), signal.SIGTERM)
torch.save(accelerator.unwrap_model(model).state_dict(), out)
